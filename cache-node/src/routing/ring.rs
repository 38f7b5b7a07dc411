//! The routing ring: which members own a key, by rendezvous (highest-random-weight)
//! hashing over stable member ids. Pure; no I/O.
//!
//! Every member gets a score per key, `mix(hash(key) ^ hash(member id))`; the member with
//! the highest score owns the key, the next ones are its ordered fallbacks
//! ([`Ring::owners`]). Because a key's scores do not depend on the other members, adding a
//! member moves to it exactly the keys it now wins (≈ 1/N) and removing one moves only
//! its own keys, each to the next member by score. Member ids are stable identities
//! (StatefulSet pod names such as `analytics-hot-2`), never addresses, so a pod that
//! restarts with a new IP keeps its keys.
//!
//! Zones: a member may carry the zone it runs in. A key's choices after the first are
//! zone-diverse, so that with two copies a zone's loss never takes both:
//!
//! 1. rank the active members by score, as above; the best is the owner;
//! 2. then, in rank order, each member whose zone no earlier choice has;
//! 3. then the remaining members, in rank order.
//!
//! Members without a zone count as one zone ("unknown"), so a ring without zones (or
//! with every member in one zone) gives exactly the rank order: the choices of a ring
//! published before zones existed do not move. The owner never depends on zones, so the
//! balance of first copies is that of plain rendezvous hashing; what zones move is the
//! later choices (with `replicas: 2`, the second copies). With uneven zones the lone
//! zone's members take more second copies (3 members in one zone and 1 in another: the
//! one holds a copy of every key) — the price of surviving a zone, and why the operator
//! spreads pods over zones evenly by default. Removing a member changes the choices of
//! only the keys it was among the first `n` choices of ([`Ring::owners_without`] gives
//! them).
//!
//! Member states:
//!
//! - `active`: owns keys.
//! - `joining`: known to the ring (reachable, may receive handed-off entries) but owns no
//!   keys yet; turning it `active` in a later ring version moves its keys to it.
//! - `draining`: leaving; owns no keys, which fall to their next choice, while the member
//!   can still be asked for entries it holds.
//!
//! The hash and the zone rule are part of the wire contract (a ring-aware client must
//! compute the same owners): [`key_hash`] over the key's store bytes (kind byte + key,
//! see `key.rs`), [`key_hash`] over the UTF-8 member id, combined with [`score`]. The
//! golden tests `hash_is_stable` and `zone_diverse_choices_are_stable` pin them.
//!
//! Owns: the hash and the ring. Pure; must not import anything of the node but `key`.

use std::cmp::Ordering;

/// A member's stable identity (in a cluster: the pod name).
pub type MemberId = String;

// A member's routing state is the published one (`crds::node_config`): one type from
// the operator's ring to the node's.
pub use crds::node_config::MemberState;

/// One member of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingMember {
    id: MemberId,
    state: MemberState,
    seed: u64,
    zone: Option<String>,
}

impl RingMember {
    /// A member with `id` in `state`, in no known zone.
    pub fn new(id: impl Into<MemberId>, state: MemberState) -> Self {
        let id = id.into();
        let seed = key_hash(id.as_bytes());
        Self {
            id,
            state,
            seed,
            zone: None,
        }
    }

    /// This member in `zone` (`None`: unknown, one zone with every other member
    /// without one).
    #[must_use]
    pub fn with_zone(mut self, zone: Option<String>) -> Self {
        self.zone = zone;
        self
    }

    /// The member's zone, if known.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The member's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The member's state.
    pub fn state(&self) -> MemberState {
        self.state
    }
}

/// A versioned set of members. Versions only move forward (see `members.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    version: u64,
    members: Vec<RingMember>,
    /// Indices of the members that own keys, in `members` order.
    owning: Vec<usize>,
    /// Each member's zone as a small number (same zone, same number; 0 for no zone), in
    /// `members` order, so choosing a key's owners compares integers, not strings.
    zone_slots: Vec<u32>,
    /// Whether the owning members span more than one zone: otherwise the choices are
    /// the rank order and the zone pass is skipped.
    zoned: bool,
}

impl Ring {
    /// A ring at `version` over `members` (ids are expected to be unique; `members.rs`
    /// validates that before building a ring).
    pub fn new(version: u64, members: Vec<RingMember>) -> Self {
        let owning: Vec<usize> = members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.state.owns_keys())
            .map(|(index, _)| index)
            .collect();
        let mut zones: Vec<&str> = Vec::new();
        let zone_slots: Vec<u32> = members
            .iter()
            .map(|member| {
                let Some(zone) = member.zone.as_deref() else {
                    return 0;
                };
                let slot = zones.iter().position(|z| *z == zone).unwrap_or_else(|| {
                    zones.push(zone);
                    zones.len() - 1
                });
                u32::try_from(slot + 1).unwrap_or(u32::MAX)
            })
            .collect();
        let first_zone = owning.first().map(|&index| zone_slots[index]);
        let zoned = owning
            .iter()
            .any(|&index| Some(zone_slots[index]) != first_zone);
        Self {
            version,
            members,
            owning,
            zone_slots,
            zoned,
        }
    }

    /// The ring version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every member, in document order.
    pub fn members(&self) -> &[RingMember] {
        &self.members
    }

    /// The member with `id`, if any.
    pub fn member(&self, id: &str) -> Option<&RingMember> {
        self.members.iter().find(|member| member.id == id)
    }

    /// The owner of a key given by its store bytes: the active member with the highest
    /// score. `None` when no member is active.
    pub fn owner(&self, key: &[u8]) -> Option<&MemberId> {
        let hash = key_hash(key);
        // One score per member, kept with the best so far (ties go to the greater id,
        // as in `compare`).
        let mut best: Option<(u64, &RingMember)> = None;
        for &index in &self.owning {
            let member = &self.members[index];
            let score = score(hash, member.seed);
            let better = match best {
                None => true,
                Some((top, leader)) => {
                    score > top || (score == top && member.id.as_str() > leader.id.as_str())
                }
            };
            if better {
                best = Some((score, member));
            }
        }
        best.map(|(_, member)| &member.id)
    }

    /// The first `n` choices for a key, best first: the owner, then its fallbacks
    /// (replicas, a restarting owner), zone-diverse as the module docs say. Only active
    /// members; fewer than `n` when fewer are active.
    pub fn owners(&self, key: &[u8], n: usize) -> Vec<&MemberId> {
        self.choose(key, n, None)
    }

    /// The first `n` choices for a key once the member `leaving` has left the ring (as
    /// if it were draining): where its copies of the key go. The same as
    /// [`Ring::owners`] when `leaving` is not an active member.
    pub fn owners_without(&self, key: &[u8], n: usize, leaving: &str) -> Vec<&MemberId> {
        self.choose(key, n, Some(leaving))
    }

    /// The first `n` active members by score alone, ignoring zones (the choices of this
    /// ring were it without zones; [`Ring::owners`] for a ring without zones).
    pub fn ranked(&self, key: &[u8], n: usize) -> Vec<&MemberId> {
        self.rank(key, None)
            .into_iter()
            .take(n)
            .map(|index| &self.members[index].id)
            .collect()
    }

    /// Indices of the active members (but `leaving`) by score for `key`, best first.
    fn rank(&self, key: &[u8], leaving: Option<&str>) -> Vec<usize> {
        let hash = key_hash(key);
        let mut ranked: Vec<usize> = self
            .owning
            .iter()
            .copied()
            .filter(|&index| Some(self.members[index].id.as_str()) != leaving)
            .collect();
        ranked.sort_unstable_by(|&a, &b| compare(hash, &self.members[b], &self.members[a]));
        ranked
    }

    /// The zone-diverse choice of the module docs over the ranked members.
    fn choose(&self, key: &[u8], n: usize, leaving: Option<&str>) -> Vec<&MemberId> {
        let ranked = self.rank(key, leaving);
        if !self.zoned || n <= 1 {
            return ranked
                .into_iter()
                .take(n)
                .map(|index| &self.members[index].id)
                .collect();
        }
        // Positions in `ranked` of the choices, in choice order.
        let mut chosen: Vec<usize> = Vec::with_capacity(n);
        let mut zones_used: Vec<u32> = Vec::with_capacity(n);
        for (position, &index) in ranked.iter().enumerate() {
            if chosen.len() == n {
                break;
            }
            let zone = self.zone_slots[index];
            if !zones_used.contains(&zone) {
                chosen.push(position);
                zones_used.push(zone);
            }
        }
        for position in 0..ranked.len() {
            if chosen.len() == n {
                break;
            }
            if !chosen.contains(&position) {
                chosen.push(position);
            }
        }
        chosen
            .into_iter()
            .map(|position| &self.members[ranked[position]].id)
            .collect()
    }
}

/// Orders two members by their score for a key, ties broken by id (ids are unique).
fn compare(key_hash: u64, a: &RingMember, b: &RingMember) -> Ordering {
    score(key_hash, a.seed)
        .cmp(&score(key_hash, b.seed))
        .then_with(|| a.id.cmp(&b.id))
}

/// A member's score for a key: the murmur3 64-bit finaliser of the two hashes combined.
pub fn score(key_hash: u64, member_hash: u64) -> u64 {
    fmix64(key_hash ^ member_hash.rotate_left(32).wrapping_mul(K1))
}

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xff51_afd7_ed55_8ccd;
const K3: u64 = 0xc4ce_b9fe_1a85_ec53;

/// The stable 64-bit hash of key bytes (and of member ids): 8-byte little-endian words
/// folded with a multiply-xorshift, the length mixed in, then the murmur3 finaliser.
pub fn key_hash(bytes: &[u8]) -> u64 {
    let mut hash = K1 ^ (bytes.len() as u64).wrapping_mul(K2);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        hash = (hash ^ u64::from_le_bytes(word)).wrapping_mul(K1);
        hash ^= hash >> 29;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        hash = (hash ^ u64::from_le_bytes(word)).wrapping_mul(K1);
        hash ^= hash >> 29;
    }
    fmix64(hash)
}

/// murmur3's 64-bit finaliser: every input bit affects every output bit.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(K2);
    h ^= h >> 33;
    h = h.wrapping_mul(K3);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn ring(n: usize) -> Ring {
        Ring::new(
            1,
            (0..n)
                .map(|i| RingMember::new(format!("pool-{i}"), MemberState::Active))
                .collect(),
        )
    }

    fn keys(count: usize, salt: u64) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| format!("Preports/{salt}/{i}").into_bytes())
            .collect()
    }

    /// Golden values: changing them re-routes every key of every cluster and breaks
    /// ring-aware clients.
    #[test]
    fn hash_is_stable() {
        assert_eq!(key_hash(b""), 0x9ca0_66f1_a4ab_2eea);
        assert_eq!(key_hash(b"Preports/daily"), 0x2a3c_c39f_ef2d_98c4);
        let ring = ring(3);
        assert_eq!(ring.owner(b"Preports/daily").unwrap(), "pool-1");
    }

    #[test]
    fn empty_or_inactive_rings_own_nothing() {
        assert_eq!(Ring::new(1, vec![]).owner(b"Pa"), None);
        let ring = Ring::new(
            2,
            vec![
                RingMember::new("a", MemberState::Joining),
                RingMember::new("b", MemberState::Draining),
            ],
        );
        assert_eq!(ring.owner(b"Pa"), None);
        assert!(ring.owners(b"Pa", 2).is_empty());
        assert_eq!(ring.member("b").unwrap().state(), MemberState::Draining);
    }

    #[test]
    fn owners_are_distinct_ordered_and_start_with_the_owner() {
        let ring = ring(5);
        for key in keys(500, 7) {
            let owners = ring.owners(&key, 3);
            assert_eq!(owners.len(), 3);
            assert_eq!(owners[0], ring.owner(&key).unwrap());
            assert!(owners[0] != owners[1] && owners[1] != owners[2] && owners[0] != owners[2]);
        }
        assert_eq!(ring.owners(b"Pa", 9).len(), 5);
    }

    #[test]
    fn joining_and_draining_members_own_nothing_and_keys_fall_to_the_next_choice() {
        let all = ring(4);
        let mut members = all.members().to_vec();
        members[2] = RingMember::new("pool-2", MemberState::Draining);
        let drained = Ring::new(2, members);
        for key in keys(2000, 3) {
            let before = all.owners(&key, 2);
            let after = drained.owner(&key).unwrap();
            if before[0] == "pool-2" {
                assert_eq!(after, before[1]);
            } else {
                assert_eq!(after, before[0]);
            }
        }
    }

    /// max/mean keys per member for `members` members over `count` keys.
    fn imbalance(ring: &Ring, count: usize) -> f64 {
        let mut load: HashMap<&str, usize> = HashMap::new();
        for key in keys(count, 11) {
            *load.entry(ring.owner(&key).unwrap().as_str()).or_default() += 1;
        }
        let max = load.values().copied().max().unwrap_or(0) as f64;
        max / (count as f64 / ring.owning.len() as f64)
    }

    #[test]
    fn load_is_balanced_across_members() {
        for n in [3, 8, 16, 64] {
            // 20,000 keys per member keeps the expected max/mean under ~1.03.
            let ratio = imbalance(&ring(n), 20_000 * n);
            assert!(ratio < 1.05, "{n} members: max/mean {ratio:.3}");
        }
    }

    /// `n` members `pool-<i>`, member `i` in the zone `zones(i)`.
    fn zoned_ring(n: usize, zones: impl Fn(usize) -> Option<String>) -> Ring {
        Ring::new(
            1,
            (0..n)
                .map(|i| {
                    RingMember::new(format!("pool-{i}"), MemberState::Active).with_zone(zones(i))
                })
                .collect(),
        )
    }

    /// The choices as `Ring::owners` made them before zones existed: the first `n`
    /// active members by score.
    fn owners_before_zones<'a>(ring: &'a Ring, key: &[u8], n: usize) -> Vec<&'a MemberId> {
        let hash = key_hash(key);
        let mut ranked: Vec<&RingMember> = ring
            .members()
            .iter()
            .filter(|m| m.state().owns_keys())
            .collect();
        ranked.sort_unstable_by(|a, b| compare(hash, b, a));
        ranked.into_iter().take(n).map(|m| &m.id).collect()
    }

    /// Golden choices of a zoned ring: changing them moves second copies in every
    /// cluster with zones and breaks ring-aware clients.
    #[test]
    fn zone_diverse_choices_are_stable() {
        let zones = ["zone-a", "zone-a", "zone-b", "zone-c", "zone-a", "zone-b"];
        let ring = zoned_ring(6, |i| Some(zones[i].to_owned()));
        let got: Vec<Vec<&str>> = ["Preports/daily", "Pa", "Pb", "Pc"]
            .iter()
            .map(|key| {
                ring.owners(key.as_bytes(), 3)
                    .into_iter()
                    .map(String::as_str)
                    .collect()
            })
            .collect();
        assert_eq!(got, GOLDEN_ZONED);
    }

    /// Checked against an independent implementation of the documented hash and rule.
    /// "Pb" ranks pool-0, pool-4 (zone-a again, skipped), pool-3, pool-5; "Pc" ranks
    /// pool-1, pool-5, pool-2 (zone-b again, skipped), pool-3.
    const GOLDEN_ZONED: [[&str; 3]; 4] = [
        ["pool-3", "pool-1", "pool-2"],
        ["pool-1", "pool-3", "pool-5"],
        ["pool-0", "pool-3", "pool-5"],
        ["pool-1", "pool-5", "pool-3"],
    ];

    /// For 10,000 keys: the two copies sit in different zones, the owner is the
    /// zoneless ring's, and so the first copies are balanced as before.
    #[test]
    fn two_copies_sit_in_different_zones() {
        let layouts: [(&str, &[&str]); 3] = [
            ("3 members in 3 zones", &["a", "b", "c"]),
            ("6 members in 3 zones", &["a", "b", "c", "a", "b", "c"]),
            ("4 members in 2 zones (3+1)", &["a", "a", "a", "b"]),
        ];
        for (layout, zones) in layouts {
            let n = zones.len();
            let zoned = zoned_ring(n, |i| Some(zones[i].to_owned()));
            let plain = ring(n);
            let zone_of = |id: &str| zoned.member(id).and_then(RingMember::zone).unwrap();
            let mut primaries: HashMap<&str, usize> = HashMap::new();
            for key in keys(10_000, 5) {
                let owners = zoned.owners(&key, 2);
                assert_eq!(owners.len(), 2, "{layout}");
                assert_ne!(zone_of(owners[0]), zone_of(owners[1]), "{layout}");
                assert_eq!(owners[0], plain.owner(&key).unwrap(), "{layout}");
                assert_eq!(owners[0], zoned.owner(&key).unwrap(), "{layout}");
                *primaries.entry(owners[0].as_str()).or_default() += 1;
            }
            let max = primaries.values().copied().max().unwrap_or(0) as f64;
            let ratio = max / (10_000.0 / n as f64);
            assert!(ratio < 1.1, "{layout}: primaries max/mean {ratio:.3}");
            assert_eq!(imbalance(&zoned, 10_000 * n), imbalance(&plain, 10_000 * n));
        }
    }

    #[test]
    fn later_choices_prefer_new_zones_then_fill_in_rank_order() {
        // Two zones: the third choice can only repeat a zone, and it is the best-ranked
        // member left.
        let zones = ["a", "a", "a", "b"];
        let ring = zoned_ring(4, |i| Some(zones[i].to_owned()));
        for key in keys(2000, 9) {
            let ranked = ring.ranked(&key, 4);
            let owners = ring.owners(&key, 4);
            assert_eq!(owners[0], ranked[0]);
            let zone = |id: &MemberId| ring.member(id).and_then(RingMember::zone);
            let other = ranked
                .iter()
                .find(|id| zone(id) != zone(ranked[0]))
                .unwrap();
            assert_eq!(owners[1], *other);
            let rest: Vec<&MemberId> = ranked
                .iter()
                .copied()
                .filter(|id| *id != owners[0] && *id != owners[1])
                .collect();
            assert_eq!(owners[2..], rest[..]);
        }
        // Members without a zone are one zone: beside a zoned member they are diverse
        // from it, but not from each other.
        let ring = zoned_ring(3, |i| (i == 0).then(|| "a".to_owned()));
        for key in keys(500, 4) {
            let owners = ring.owners(&key, 2);
            let zones: Vec<Option<&str>> = owners
                .iter()
                .map(|id| ring.member(id).and_then(RingMember::zone))
                .collect();
            assert_ne!(zones[0], zones[1], "{owners:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A ring without zones, or with every member in one zone, chooses exactly as
        /// before zones existed: no key of an upgraded cluster moves.
        #[test]
        fn zoneless_rings_choose_as_before(n in 1usize..40, copies in 1usize..4, salt in any::<u64>(), one_zone in any::<bool>()) {
            let before = ring(n);
            let zone = one_zone.then(|| "zone-a".to_owned());
            let after = zoned_ring(n, |_| zone.clone());
            for key in keys(500, salt) {
                prop_assert_eq!(after.owners(&key, copies), owners_before_zones(&before, &key, copies));
                prop_assert_eq!(after.ranked(&key, copies), owners_before_zones(&before, &key, copies));
            }
        }

        /// `owners_without` is the choice of the ring with that member draining.
        #[test]
        fn owners_without_is_the_ring_with_the_member_draining(n in 2usize..20, zones in 1usize..4, gone in any::<prop::sample::Index>(), salt in any::<u64>()) {
            let ring = zoned_ring(n, |i| Some(format!("z{}", i % zones)));
            let gone = format!("pool-{}", gone.index(n));
            let drained = Ring::new(2, ring.members().iter().map(|m| {
                if m.id() == gone {
                    RingMember::new(m.id(), MemberState::Draining).with_zone(m.zone.clone())
                } else {
                    m.clone()
                }
            }).collect());
            for key in keys(300, salt) {
                prop_assert_eq!(ring.owners_without(&key, 2, &gone), drained.owners(&key, 2));
            }
        }

        /// With zones, removing a member still moves only the keys it held: a key it was
        /// not among the first `copies` choices of keeps them all, and a key it owned
        /// goes to the next member by score.
        #[test]
        fn removing_a_zoned_member_moves_only_its_keys(n in 2usize..30, zones in 1usize..4, copies in 1usize..3, gone in any::<prop::sample::Index>(), salt in any::<u64>()) {
            let before = zoned_ring(n, |i| Some(format!("z{}", i % zones)));
            let gone = format!("pool-{}", gone.index(n));
            let after = Ring::new(2, before.members().iter().filter(|m| m.id() != gone).cloned().collect());
            for key in keys(1000, salt) {
                let (old, now) = (before.owners(&key, copies), after.owners(&key, copies));
                if old.contains(&&gone) {
                    prop_assert!(!now.contains(&&gone));
                    if old[0] == &gone {
                        prop_assert_eq!(now[0], before.ranked(&key, 2)[1]);
                    } else {
                        prop_assert_eq!(now[0], old[0]);
                    }
                } else {
                    prop_assert_eq!(old, now);
                }
            }
        }

        /// Adding a member moves only keys that go to the new member, about 1/(N+1).
        #[test]
        fn adding_a_member_moves_only_its_share(n in 1usize..40, salt in any::<u64>()) {
            let before = ring(n);
            let after = ring(n + 1);
            let new = format!("pool-{n}");
            let keys = keys(4000, salt);
            let mut moved = 0usize;
            for key in &keys {
                let (old, now) = (before.owner(key).unwrap(), after.owner(key).unwrap());
                if old != now {
                    prop_assert_eq!(now, &new);
                    moved += 1;
                }
            }
            let ideal = keys.len() as f64 / (n + 1) as f64;
            // Binomial spread: allow 5 standard deviations around the ideal share.
            let slack = 5.0 * ideal.sqrt() + 1.0;
            prop_assert!((moved as f64 - ideal).abs() <= slack, "moved {} ideal {}", moved, ideal);
        }

        /// Removing a member moves exactly its keys, each to another member.
        #[test]
        fn removing_a_member_moves_only_its_keys(n in 2usize..40, gone in any::<prop::sample::Index>(), salt in any::<u64>()) {
            let before = ring(n);
            let gone = format!("pool-{}", gone.index(n));
            let after = Ring::new(2, before.members().iter().filter(|m| m.id() != gone).cloned().collect());
            for key in keys(2000, salt) {
                let (old, now) = (before.owner(&key).unwrap(), after.owner(&key).unwrap());
                if old == &gone {
                    prop_assert!(now != &gone);
                    prop_assert_eq!(now, before.owners(&key, 2)[1]);
                } else {
                    prop_assert_eq!(old, now);
                }
            }
        }

        /// Member order in the document does not change ownership.
        #[test]
        fn ownership_ignores_member_order(n in 1usize..20, salt in any::<u64>()) {
            let forward = ring(n);
            let mut reversed = forward.members().to_vec();
            reversed.reverse();
            let reversed = Ring::new(1, reversed);
            for key in keys(300, salt) {
                prop_assert_eq!(forward.owners(&key, 3), reversed.owners(&key, 3));
            }
        }
    }
}
