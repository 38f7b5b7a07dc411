//! The routing ring: which members own a key, by rendezvous (highest-random-weight)
//! hashing over stable member ids. Pure; no I/O.
//!
//! Every member gets a score per key, `mix(hash(key) ^ hash(member id))`; the member with
//! the highest score owns the key, the next ones are its ordered fallbacks
//! ([`Ring::owners`]). Because a key's scores do not depend on the other members, adding a
//! member moves to it exactly the keys it now wins (≈ 1/N) and removing one moves only
//! its own keys, each to its second choice. Member ids are stable identities (StatefulSet
//! pod names such as `analytics-hot-2`), never addresses, so a pod that restarts with a
//! new IP keeps its keys.
//!
//! Member states:
//!
//! - `active`: owns keys.
//! - `joining`: known to the ring (reachable, may receive handed-off entries) but owns no
//!   keys yet; turning it `active` in a later ring version moves its keys to it.
//! - `draining`: leaving; owns no keys, which fall to their next choice, while the member
//!   can still be asked for entries it holds.
//!
//! The hash is part of the wire contract (a ring-aware client must compute the same
//! owners): [`key_hash`] over the key's store bytes (kind byte + key, see `key.rs`),
//! [`key_hash`] over the UTF-8 member id, combined with [`score`]. The golden test
//! `hash_is_stable` pins it.
//!
//! Owns: the hash and the ring. Pure; must not import anything of the node but `key`.

use std::cmp::Ordering;

/// A member's stable identity (in a cluster: the pod name).
pub type MemberId = String;

/// The routing state of a ring member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// Owns keys.
    Active,
    /// Known, owns no keys yet.
    Joining,
    /// Leaving, owns no keys any more.
    Draining,
}

impl MemberState {
    /// True if members in this state own keys.
    pub fn owns_keys(self) -> bool {
        matches!(self, Self::Active)
    }
}

/// One member of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingMember {
    id: MemberId,
    state: MemberState,
    seed: u64,
}

impl RingMember {
    /// A member with `id` in `state`.
    pub fn new(id: impl Into<MemberId>, state: MemberState) -> Self {
        let id = id.into();
        let seed = key_hash(id.as_bytes());
        Self { id, state, seed }
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
}

impl Ring {
    /// A ring at `version` over `members` (ids are expected to be unique; `members.rs`
    /// validates that before building a ring).
    pub fn new(version: u64, members: Vec<RingMember>) -> Self {
        let owning = members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.state.owns_keys())
            .map(|(index, _)| index)
            .collect();
        Self {
            version,
            members,
            owning,
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
    /// (replicas, a restarting owner). Only active members; fewer than `n` when fewer are
    /// active.
    pub fn owners(&self, key: &[u8], n: usize) -> Vec<&MemberId> {
        let hash = key_hash(key);
        let mut ranked: Vec<&RingMember> = self
            .owning
            .iter()
            .map(|&index| &self.members[index])
            .collect();
        ranked.sort_unstable_by(|a, b| compare(hash, b, a));
        ranked
            .into_iter()
            .take(n)
            .map(|member| &member.id)
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

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
