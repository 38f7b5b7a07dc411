//! Expiry deadlines: how they are computed from the TTL settings, and an index of
//! stored entries ordered by deadline so purging touches only what has expired.
//!
//! A deadline is `anchor + ttl`, where the anchor is the insert time (`Absolute`) or
//! the last read (`Sliding`) and `ttl` is the entry's override or else the store's
//! TTL. An entry is live while `now < deadline`. Pure, no I/O.
//!
//! Owns: deadlines and the deadline index. No I/O; like all of `store/`, imports
//! nothing outside the store and no gRPC or Flight crate.

use std::collections::BTreeSet;
use std::time::Duration;

use super::config::TtlMode;
use super::eviction::SlotId;

/// Computes an entry's deadline; saturates instead of overflowing.
pub(crate) fn compute_deadline(
    mode: TtlMode,
    created_at: Duration,
    last_access: Duration,
    ttl: Duration,
) -> Duration {
    let anchor = match mode {
        TtlMode::Absolute => created_at,
        TtlMode::Sliding => last_access,
    };
    anchor.checked_add(ttl).unwrap_or(Duration::MAX)
}

/// Stored entries ordered by deadline, earliest first.
///
/// Insert and remove are O(log n); draining the `k` expired entries is
/// O(k log n). Each slot appears at most once, under the deadline the store last
/// recorded for it.
#[derive(Debug, Default)]
pub(crate) struct ExpiryIndex {
    by_deadline: BTreeSet<(Duration, SlotId)>,
}

impl ExpiryIndex {
    /// Creates an empty index.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records `slot` as expiring at `deadline`.
    pub(crate) fn insert(&mut self, deadline: Duration, slot: SlotId) {
        self.by_deadline.insert((deadline, slot));
    }

    /// Forgets `slot`, which was recorded at `deadline`.
    pub(crate) fn remove(&mut self, deadline: Duration, slot: SlotId) {
        self.by_deadline.remove(&(deadline, slot));
    }

    /// Moves `slot` from `old` to `new` deadline.
    pub(crate) fn reschedule(&mut self, slot: SlotId, old: Duration, new: Duration) {
        if old != new {
            self.remove(old, slot);
            self.insert(new, slot);
        }
    }

    /// The slot with the earliest deadline, if that deadline is at or before `now`.
    pub(crate) fn first_expired(&self, now: Duration) -> Option<SlotId> {
        self.by_deadline
            .first()
            .filter(|(deadline, _)| *deadline <= now)
            .map(|(_, slot)| *slot)
    }

    /// Forgets every slot.
    pub(crate) fn clear(&mut self) {
        self.by_deadline.clear();
    }

    /// Number of indexed slots.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_deadline.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn absolute_deadline_counts_from_insertion_and_sliding_from_last_access() {
        let ttl = 10 * SECOND;
        assert_eq!(
            compute_deadline(TtlMode::Absolute, SECOND, 5 * SECOND, ttl),
            11 * SECOND
        );
        assert_eq!(
            compute_deadline(TtlMode::Sliding, SECOND, 5 * SECOND, ttl),
            15 * SECOND
        );
    }

    #[test]
    fn deadline_saturates() {
        assert_eq!(
            compute_deadline(TtlMode::Absolute, SECOND, SECOND, Duration::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn index_yields_expired_slots_in_deadline_order() {
        let mut index = ExpiryIndex::new();
        index.insert(3 * SECOND, 7);
        index.insert(SECOND, 9);
        index.insert(2 * SECOND, 8);
        assert_eq!(index.first_expired(Duration::ZERO), None);
        assert_eq!(
            index.first_expired(SECOND),
            Some(9),
            "deadline is exclusive"
        );
        index.remove(SECOND, 9);
        index.reschedule(8, 2 * SECOND, 10 * SECOND);
        assert_eq!(index.first_expired(5 * SECOND), Some(7));
        index.remove(3 * SECOND, 7);
        assert_eq!(index.first_expired(5 * SECOND), None);
        assert_eq!(index.len(), 1);
        index.clear();
        assert_eq!(index.len(), 0);
    }
}
