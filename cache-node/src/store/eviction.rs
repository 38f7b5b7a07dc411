//! Victim selection for the size caps: recency lists plus the LRU and W-TinyLFU
//! decision rules.
//!
//! [`EvictionOrder`] keeps two intrusive doubly linked lists over slot ids, a small
//! *window* and the *main* list, each ordered from most to least recently used, so
//! insert, touch, remove and promote are O(1). [`EvictionOrder::select`] is a pure
//! function of that order, the policy, the window share and the frequency sketch: it
//! returns a [`Selection`] and changes nothing. The store applies it, with cause
//! `Size`. No I/O.
//!
//! * `Lru`: the least recently touched entry of either list (both lists are ordered
//!   by the same tick, so the older of the two tails is the global LRU).
//! * `TinyLfu` (W-TinyLFU): new entries enter the window. When room is needed and
//!   the window holds more than its share (about 1% of the caps, at least one entry),
//!   its LRU *candidate* competes with the main LRU *victim*: the candidate is
//!   admitted to main only if its sketch frequency is strictly higher, otherwise it
//!   is the one evicted. A scan of one-hit keys therefore churns through the window
//!   without flushing frequently read keys from main.
//!
//! Owns: who is evicted next. No I/O; like all of `store/`, imports nothing outside the
//! store and no gRPC or Flight crate.

use super::config::EvictionPolicy;
use super::sketch::FrequencySketch;

/// Index of a stored entry in the store's slot table.
pub(crate) type SlotId = usize;

/// Which list an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Window,
    Main,
}

/// Per-entry links and the facts victim selection needs.
#[derive(Debug, Clone, Copy)]
struct Link {
    /// Towards the most recently used end.
    newer: Option<SlotId>,
    /// Towards the least recently used end.
    older: Option<SlotId>,
    segment: Segment,
    last_touch: u64,
    key_hash: u64,
    weight: u64,
}

/// One recency list: `newest` is the MRU end, `oldest` the LRU end.
#[derive(Debug, Default, Clone, Copy)]
struct List {
    newest: Option<SlotId>,
    oldest: Option<SlotId>,
    len: u64,
    bytes: u64,
}

/// How the caps split between the TinyLFU window (about 1%, at least one entry and
/// one byte) and the main list (the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shares {
    /// Entries the window holds before its LRU entry must leave it.
    pub(crate) window_entries: u64,
    /// Bytes the window holds before its LRU entry must leave it.
    pub(crate) window_bytes: u64,
    /// Entries main holds before newcomers must compete for a place.
    pub(crate) main_entries: u64,
    /// Bytes main holds before newcomers must compete for a place.
    pub(crate) main_bytes: u64,
}

impl Shares {
    /// Splits `max_entries` and `budget_bytes` between window and main.
    pub(crate) fn for_caps(max_entries: u64, budget_bytes: u64) -> Self {
        let window_entries = (max_entries / 100).max(1);
        let window_bytes = (budget_bytes / 100).max(1);
        Self {
            window_entries,
            window_bytes,
            main_entries: max_entries.saturating_sub(window_entries),
            main_bytes: budget_bytes.saturating_sub(window_bytes),
        }
    }
}

/// What is about to enter the window once room is made: the put being reserved or
/// committed (`entries: 1` and its bytes), or nothing (reconfiguration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Incoming {
    /// Entries about to be inserted.
    pub(crate) entries: u64,
    /// Their bytes.
    pub(crate) bytes: u64,
}

/// What to do next to free one unit of room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Selection {
    /// Remove `victim`. If `admit` is set, first move that window entry into main:
    /// it beat the victim on frequency.
    Evict {
        victim: SlotId,
        admit: Option<SlotId>,
    },
    /// Move this window entry into main without removing anything: main is empty,
    /// so there is nobody to compete with yet.
    Promote(SlotId),
}

/// Recency order of all stored entries, split into window and main lists.
#[derive(Debug, Default)]
pub(crate) struct EvictionOrder {
    links: Vec<Option<Link>>,
    window: List,
    main: List,
    tick: u64,
}

impl EvictionOrder {
    /// Creates an empty order.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Number of tracked entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.window.len + self.main.len
    }

    /// Adds a new entry as most recently used: into the window under `TinyLfu`, into
    /// main under `Lru`. A slot already present is moved instead.
    pub(crate) fn insert(
        &mut self,
        slot: SlotId,
        key_hash: u64,
        weight: u64,
        policy: EvictionPolicy,
    ) {
        self.remove(slot);
        let segment = match policy {
            EvictionPolicy::Lru => Segment::Main,
            EvictionPolicy::Tinylfu => Segment::Window,
        };
        if self.links.len() <= slot {
            self.links.resize(slot + 1, None);
        }
        self.tick += 1;
        if let Some(entry) = self.links.get_mut(slot) {
            *entry = Some(Link {
                newer: None,
                older: None,
                segment,
                last_touch: self.tick,
                key_hash,
                weight,
            });
        }
        self.push_newest(slot, segment);
    }

    /// Marks an entry as just used: most recently used within its list.
    pub(crate) fn touch(&mut self, slot: SlotId) {
        let Some(segment) = self.link(slot).map(|link| link.segment) else {
            return;
        };
        self.unlink(slot);
        self.tick += 1;
        if let Some(Some(link)) = self.links.get_mut(slot) {
            link.last_touch = self.tick;
        }
        self.push_newest(slot, segment);
    }

    /// Stops tracking an entry; unknown slots are ignored.
    pub(crate) fn remove(&mut self, slot: SlotId) {
        if self.link(slot).is_some() {
            self.unlink(slot);
            if let Some(entry) = self.links.get_mut(slot) {
                *entry = None;
            }
        }
    }

    /// Moves a window entry to the most recently used end of main, keeping its tick.
    pub(crate) fn promote(&mut self, slot: SlotId) {
        if self
            .link(slot)
            .is_some_and(|link| link.segment == Segment::Window)
        {
            self.unlink(slot);
            self.push_newest(slot, Segment::Main);
        }
    }

    /// Decides what to do next to free room; `None` when nothing is tracked.
    ///
    /// Under `TinyLfu`, the window counts as over its share if it would be once
    /// `incoming` is added. Its LRU entry then leaves it: promoted for free while main
    /// is below its own share (the cache is still filling), otherwise only by beating
    /// main's LRU entry on frequency. Pure: reads the order and the sketch.
    pub(crate) fn select(
        &self,
        policy: EvictionPolicy,
        shares: Shares,
        incoming: Incoming,
        sketch: &FrequencySketch,
    ) -> Option<Selection> {
        let evict = |victim| Selection::Evict {
            victim,
            admit: None,
        };
        match policy {
            EvictionPolicy::Lru => {
                let oldest_of = |list: &List| {
                    list.oldest
                        .and_then(|slot| self.link(slot).map(|link| (link.last_touch, slot)))
                };
                match (oldest_of(&self.window), oldest_of(&self.main)) {
                    (Some(window), Some(main)) => Some(evict(window.min(main).1)),
                    (Some((_, slot)), None) | (None, Some((_, slot))) => Some(evict(slot)),
                    (None, None) => None,
                }
            }
            EvictionPolicy::Tinylfu => {
                let window_over_share = self.window.len + incoming.entries > shares.window_entries
                    || self.window.bytes + incoming.bytes > shares.window_bytes;
                match (self.window.oldest, self.main.oldest) {
                    (Some(candidate), main_oldest) if window_over_share => {
                        let weight = self.link(candidate).map_or(0, |link| link.weight);
                        let main_has_room = self.main.len < shares.main_entries
                            && self.main.bytes + weight <= shares.main_bytes;
                        match main_oldest {
                            Some(victim) if !main_has_room => {
                                Some(self.compete(candidate, victim, sketch))
                            }
                            _ => Some(Selection::Promote(candidate)),
                        }
                    }
                    (_, Some(victim)) => Some(evict(victim)),
                    (Some(candidate), None) => Some(evict(candidate)),
                    (None, None) => None,
                }
            }
        }
    }

    /// TinyLFU admission: the window candidate enters main only if strictly more
    /// frequent than main's victim; otherwise the candidate itself is evicted.
    fn compete(&self, candidate: SlotId, victim: SlotId, sketch: &FrequencySketch) -> Selection {
        let frequency = |slot| {
            self.link(slot)
                .map_or(0, |link| sketch.frequency(link.key_hash))
        };
        if frequency(candidate) > frequency(victim) {
            Selection::Evict {
                victim,
                admit: Some(candidate),
            }
        } else {
            Selection::Evict {
                victim: candidate,
                admit: None,
            }
        }
    }

    fn link(&self, slot: SlotId) -> Option<&Link> {
        self.links.get(slot).and_then(Option::as_ref)
    }

    fn list_mut(&mut self, segment: Segment) -> &mut List {
        match segment {
            Segment::Window => &mut self.window,
            Segment::Main => &mut self.main,
        }
    }

    /// Detaches a tracked slot from its list, keeping its link record.
    fn unlink(&mut self, slot: SlotId) {
        let Some(link) = self.link(slot).copied() else {
            return;
        };
        match link.newer {
            Some(newer) => self.set_older(newer, link.older),
            None => self.list_mut(link.segment).newest = link.older,
        }
        match link.older {
            Some(older) => self.set_newer(older, link.newer),
            None => self.list_mut(link.segment).oldest = link.newer,
        }
        let list = self.list_mut(link.segment);
        list.len -= 1;
        list.bytes -= link.weight;
    }

    /// Attaches a slot with a link record at the newest end of `segment`.
    fn push_newest(&mut self, slot: SlotId, segment: Segment) {
        let previous_newest = self.list_mut(segment).newest;
        let Some(Some(link)) = self.links.get_mut(slot) else {
            return;
        };
        link.segment = segment;
        link.newer = None;
        link.older = previous_newest;
        let weight = link.weight;
        match previous_newest {
            Some(previous) => self.set_newer(previous, Some(slot)),
            None => self.list_mut(segment).oldest = Some(slot),
        }
        let list = self.list_mut(segment);
        list.newest = Some(slot);
        list.len += 1;
        list.bytes += weight;
    }

    fn set_newer(&mut self, slot: SlotId, newer: Option<SlotId>) {
        if let Some(Some(link)) = self.links.get_mut(slot) {
            link.newer = newer;
        }
    }

    fn set_older(&mut self, slot: SlotId, older: Option<SlotId>) {
        if let Some(Some(link)) = self.links.get_mut(slot) {
            link.older = older;
        }
    }

    /// Slots from least to most recently used in each list: `(window, main)`.
    #[cfg(test)]
    fn oldest_first(&self) -> (Vec<SlotId>, Vec<SlotId>) {
        let walk = |list: &List| {
            let mut order = Vec::new();
            let mut cursor = list.oldest;
            while let Some(slot) = cursor {
                order.push(slot);
                cursor = self.link(slot).and_then(|link| link.newer);
            }
            order
        };
        (walk(&self.window), walk(&self.main))
    }

    /// Bytes tracked in the window and main lists.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.window.bytes + self.main.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window: 1 entry or 1000 bytes; main: 2 entries or 10 000 bytes.
    const SHARES: Shares = Shares {
        window_entries: 1,
        window_bytes: 1000,
        main_entries: 2,
        main_bytes: 10_000,
    };

    const NOTHING: Incoming = Incoming {
        entries: 0,
        bytes: 0,
    };

    fn sketch() -> FrequencySketch {
        FrequencySketch::for_capacity(100)
    }

    fn evict(victim: SlotId) -> Option<Selection> {
        Some(Selection::Evict {
            victim,
            admit: None,
        })
    }

    fn lru(order: &EvictionOrder) -> Option<Selection> {
        order.select(EvictionPolicy::Lru, SHARES, NOTHING, &sketch())
    }

    /// An order with `main` promoted into main and `window` left in the window.
    fn tinylfu_order(main: &[SlotId], window: &[SlotId], weight: u64) -> EvictionOrder {
        let mut order = EvictionOrder::new();
        for &slot in main.iter().chain(window) {
            order.insert(slot, slot as u64, weight, EvictionPolicy::Tinylfu);
        }
        for &slot in main {
            order.promote(slot);
        }
        order
    }

    #[test]
    fn lru_evicts_the_least_recently_touched_entry() {
        let mut order = EvictionOrder::new();
        for slot in 0..3 {
            order.insert(slot, slot as u64, 10, EvictionPolicy::Lru);
        }
        assert_eq!(lru(&order), evict(0));
        order.touch(0);
        assert_eq!(order.oldest_first().1, vec![1, 2, 0]);
        assert_eq!(lru(&order), evict(1));
        order.remove(1);
        assert_eq!(lru(&order), evict(2));
        assert_eq!(order.len(), 2);
        assert_eq!(order.bytes(), 20);
    }

    #[test]
    fn lru_compares_both_lists_after_a_policy_switch() {
        let mut order = EvictionOrder::new();
        order.insert(0, 0, 1, EvictionPolicy::Tinylfu); // window
        order.insert(1, 1, 1, EvictionPolicy::Lru); // main
        order.insert(2, 2, 1, EvictionPolicy::Tinylfu); // window
        assert_eq!(lru(&order), evict(0));
        order.touch(0);
        assert_eq!(lru(&order), evict(1));
    }

    #[test]
    fn tinylfu_admits_a_window_candidate_only_if_strictly_more_frequent() {
        let mut sketch = sketch();
        let order = tinylfu_order(&[0, 1], &[2, 3], 1);
        let select = |sketch: &FrequencySketch| {
            order.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, sketch)
        };
        assert_eq!(select(&sketch), evict(2), "a tie keeps the incumbent");
        sketch.increment(2);
        assert_eq!(
            select(&sketch),
            Some(Selection::Evict {
                victim: 0,
                admit: Some(2)
            })
        );
    }

    #[test]
    fn tinylfu_promotes_for_free_while_main_is_below_its_share() {
        let order = tinylfu_order(&[0], &[1, 2], 1);
        let selection = order.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, &sketch());
        assert_eq!(selection, Some(Selection::Promote(1)));
        let empty_main = tinylfu_order(&[], &[0, 1, 2], 1);
        let selection = empty_main.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, &sketch());
        assert_eq!(selection, Some(Selection::Promote(0)));
    }

    #[test]
    fn tinylfu_evicts_from_main_while_the_window_is_within_its_share() {
        let order = tinylfu_order(&[0, 1], &[2], 1);
        let selection = order.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, &sketch());
        assert_eq!(selection, evict(0));
    }

    #[test]
    fn tinylfu_counts_the_incoming_entry_against_the_window_share() {
        let order = tinylfu_order(&[0, 1], &[2], 1);
        let incoming = Incoming {
            entries: 1,
            bytes: 10,
        };
        let selection = order.select(EvictionPolicy::Tinylfu, SHARES, incoming, &sketch());
        assert_eq!(selection, evict(2));
    }

    #[test]
    fn tinylfu_counts_window_bytes_against_its_share() {
        let mut order = tinylfu_order(&[0, 1], &[], 1);
        order.insert(2, 2, 5000, EvictionPolicy::Tinylfu);
        let selection = order.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, &sketch());
        assert_eq!(selection, evict(2));
    }

    #[test]
    fn tinylfu_with_a_single_entry_cap_promotes_then_evicts() {
        let shares = Shares::for_caps(1, 1000);
        let mut order = tinylfu_order(&[], &[0], 1);
        let incoming = Incoming {
            entries: 1,
            bytes: 1,
        };
        let select = |order: &EvictionOrder| {
            order.select(EvictionPolicy::Tinylfu, shares, incoming, &sketch())
        };
        assert_eq!(select(&order), Some(Selection::Promote(0)));
        order.promote(0);
        assert_eq!(select(&order), evict(0));
    }

    #[test]
    fn touch_keeps_an_entry_in_its_list() {
        let mut order = EvictionOrder::new();
        order.insert(0, 0, 1, EvictionPolicy::Tinylfu);
        order.insert(1, 1, 1, EvictionPolicy::Tinylfu);
        order.promote(0);
        order.insert(2, 2, 1, EvictionPolicy::Lru);
        order.touch(0);
        order.touch(1);
        assert_eq!(order.oldest_first(), (vec![1], vec![2, 0]));
    }

    #[test]
    fn empty_order_selects_nothing_and_ignores_unknown_slots() {
        let mut order = EvictionOrder::new();
        order.touch(5);
        order.remove(5);
        order.promote(5);
        assert_eq!(lru(&order), None);
        assert_eq!(
            order.select(EvictionPolicy::Tinylfu, SHARES, NOTHING, &sketch()),
            None
        );
        assert_eq!(order.len(), 0);
    }

    #[test]
    fn window_share_is_about_one_percent_and_at_least_one() {
        let small = Shares::for_caps(10, 50);
        assert_eq!((small.window_entries, small.window_bytes), (1, 1));
        assert_eq!((small.main_entries, small.main_bytes), (9, 49));
        let large = Shares::for_caps(10_000, 1 << 30);
        assert_eq!(
            (large.window_entries, large.window_bytes),
            (100, (1 << 30) / 100)
        );
        assert_eq!(large.main_entries, 9_900);
    }
}
