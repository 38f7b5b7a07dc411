//! The ring a pool's nodes route by, as the operator publishes it. Pure.
//!
//! Members are the StatefulSet's pods, identified by their stable names
//! (`<cluster>-<pool>-<ordinal>`) and addressed by their stable DNS names through the
//! headless Service, so a restarted pod keeps its identity and its keys. The version
//! moves forward exactly when the members, their states or the replica count change,
//! and never below a version a node may already have seen (the ConfigMap's and the
//! status's), so nodes accept every new ring and refuse stale ones.
//!
//! Zones: each member carries the zone its pod runs in (its Node's
//! `topology.kubernetes.io/zone`), so that nodes put a key's copies in different zones
//! (`cache-node/src/routing/ring.rs`). A zone is published only when it is safe and
//! useful ([`compute_zones`]): every node of the pool must read zones (a node of an older
//! image refuses a ring carrying them — an unknown field — so publishing one to it would
//! stop every ring push and with it the rollout that replaces it), and a member whose
//! pod's zone is not known this pass (not scheduled yet, its Node unreadable: no
//! permission, a lost machine, an API error) keeps the zone last published for it, so a
//! restart or an API hiccup does not move copies back and forth. A member's zone change
//! is a ring change (a new version): with two copies it moves second copies.
//!
//! Owns: member ids, addresses, states and zones as published. Must not import kube's
//! client, tokio or any I/O (checked by `scripts/check-layers`); imports `build::names`
//! and `validate` only.

use std::collections::{BTreeMap, BTreeSet};

use crds::node_config::{MemberState, Topology, TopologyMember, is_zone_name};

use crate::build::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// The member id of ordinal `ordinal` of `pool`: the pod's name.
pub fn member_id(cluster: &ValidatedCluster, pool: &ValidatedPool, ordinal: i32) -> String {
    format!(
        "{}-{ordinal}",
        names::pool_object(&cluster.name, &pool.name)
    )
}

/// Where peers reach a member: its stable DNS name through the headless Service.
pub fn member_address(cluster: &ValidatedCluster, pool: &ValidatedPool, ordinal: i32) -> String {
    format!(
        "{}:{}",
        member_host(cluster, pool, &member_id(cluster, pool, ordinal)),
        cluster.port
    )
}

/// The stable DNS name of member `member` (a pod name) through the headless Service.
pub fn member_host(cluster: &ValidatedCluster, pool: &ValidatedPool, member: &str) -> String {
    format!(
        "{member}.{}.{}.svc.{}",
        names::headless_service(&cluster.name, &pool.name),
        cluster.namespace,
        cluster.cluster_domain,
    )
}

/// The ordinal of a pod or member name (`analytics-hot-2` → 2).
pub fn ordinal_of(name: &str) -> Option<i32> {
    name.rsplit_once('-')?.1.parse().ok()
}

/// The ring of `pool` with the given member states and zones (by ordinal; a member
/// missing from `zones` has none), versioned after `previous` (the ring last published,
/// if any) and never at or below `seen` unless it equals `previous`.
pub fn plan_topology(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    states: &BTreeMap<i32, MemberState>,
    zones: &BTreeMap<i32, String>,
    previous: Option<&Topology>,
    seen: u64,
) -> Topology {
    let members = states
        .iter()
        .map(|(&ordinal, &state)| TopologyMember {
            id: member_id(cluster, pool, ordinal),
            address: member_address(cluster, pool, ordinal),
            state,
            zone: zones.get(&ordinal).cloned(),
        })
        .collect();
    let replicas = u8::try_from(pool.replicas.clamp(1, 2)).unwrap_or(1);
    let mut topology = Topology {
        version: 0,
        replicas,
        members,
    };
    topology.version = match previous {
        Some(previous) if same_ring(previous, &topology) && previous.version >= seen => {
            previous.version
        }
        Some(previous) => previous.version.max(seen) + 1,
        None => seen + 1,
    };
    topology
}

/// Whether two rings route the same way (members, addresses, states, zones and
/// replicas; the member order does not matter).
pub fn same_ring(a: &Topology, b: &Topology) -> bool {
    type MemberKey<'a> = (&'a str, &'a str, MemberState, Option<&'a str>);
    fn key(t: &Topology) -> (u8, Vec<MemberKey<'_>>) {
        let mut members: Vec<MemberKey<'_>> = t
            .members
            .iter()
            .map(|m| {
                (
                    m.id.as_str(),
                    m.address.as_str(),
                    m.state,
                    m.zone.as_deref(),
                )
            })
            .collect();
        members.sort_by(|x, y| x.0.cmp(y.0));
        (t.replicas, members)
    }
    key(a) == key(b)
}

/// Where an observed pod runs, as far as its Node says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodZone {
    /// Not known this pass: the pod is not scheduled yet, or its Node could not be read
    /// (no permission, gone with a lost machine, an API error). Its member keeps the
    /// zone the ring last published for it.
    #[default]
    Unknown,
    /// The pod's Node was read: its `topology.kubernetes.io/zone` label (`None`: it has
    /// none, or an empty one).
    Known(Option<String>),
}

/// One observed pod of a pool, as [`compute_zones`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct ZoneSighting<'a> {
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Where it runs.
    pub zone: &'a PodZone,
    /// The image its node container runs.
    pub image: Option<&'a str>,
    /// What a Ready node reported this pass: whether it reads zones (`None`: not asked,
    /// or no answer).
    pub reads_zones: Option<bool>,
}

/// The zone to publish for each member of `states` (by ordinal; a member without an
/// entry gets none).
///
/// Nothing, unless [`zones_readable`]: publishing zones to a node that cannot read them
/// would make it refuse every ring. Otherwise each member's pod's zone when its Node was
/// read this pass, else the zone `previous` published for it (kept through restarts and
/// API errors; a member new to the ring starts without one).
pub fn compute_zones(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    states: &BTreeMap<i32, MemberState>,
    sightings: &[ZoneSighting<'_>],
    previous: Option<&Topology>,
) -> BTreeMap<i32, String> {
    if !zones_readable(pool, sightings) {
        return BTreeMap::new();
    }
    let published = |ordinal: i32| {
        let id = member_id(cluster, pool, ordinal);
        previous?
            .members
            .iter()
            .find(|member| member.id == id)?
            .zone
            .clone()
    };
    states
        .keys()
        .filter_map(|&ordinal| {
            let seen = sightings
                .iter()
                .find(|s| s.ordinal == ordinal)
                .map_or(&PodZone::Unknown, |s| s.zone);
            let zone = match seen {
                PodZone::Known(zone) => zone.clone(),
                PodZone::Unknown => published(ordinal),
            };
            zone.filter(|zone| is_zone_name(zone))
                .map(|zone| (ordinal, zone))
        })
        .collect()
}

/// Whether every node of the pool reads ring zones, now and when it next starts: no
/// Ready node reports that it cannot, and the pool's image and every pod's image are
/// known to — the operator's own node image (released with it) or an image a Ready
/// node running it reported reading them. A pod of an unknown image (a rollout to an
/// image that has not answered yet) withholds zones until it has, so a downgrade to an
/// image without zones drops them from the ring before its pods start.
pub fn zones_readable(pool: &ValidatedPool, sightings: &[ZoneSighting<'_>]) -> bool {
    if sightings.iter().any(|s| s.reads_zones == Some(false)) {
        return false;
    }
    let mut known: BTreeSet<&str> = sightings
        .iter()
        .filter(|s| s.reads_zones == Some(true))
        .filter_map(|s| s.image)
        .collect();
    if pool.image_reads_zones {
        known.insert(pool.image.as_str());
    }
    known.contains(pool.image.as_str())
        && sightings
            .iter()
            .all(|s| s.image.is_some_and(|image| known.contains(image)))
}

/// Members a `RingChanged` note names one by one. A larger ring is summarised (its
/// members counted by state, then the first ones not active), so the note stays within
/// the 1 KiB an `events.k8s.io/v1` Event may carry even with the longest names (member
/// ids of 56 characters); the API server refuses a longer one and the event is lost.
const NOTE_MEMBERS: usize = 10;

/// The note of the `RingChanged` event of `pool`: the version, and every member with
/// its state (a ring of more than ten members: how many are in each state, and the
/// first ten that are not active).
pub fn ring_changed_note(pool: &str, topology: &Topology) -> String {
    let named = |m: &TopologyMember| match m.state {
        MemberState::Active => m.id.clone(),
        MemberState::Joining => format!("{} joining", m.id),
        MemberState::Draining => format!("{} draining", m.id),
    };
    let version = topology.version;
    if topology.members.len() <= NOTE_MEMBERS {
        let members = topology.members.iter().map(named).collect::<Vec<_>>();
        return format!(
            "pool {pool}: ring version {version} ({})",
            members.join(", ")
        );
    }
    let count = |state| topology.members.iter().filter(|m| m.state == state).count();
    let changing: Vec<&TopologyMember> = topology
        .members
        .iter()
        .filter(|m| m.state != MemberState::Active)
        .collect();
    let mut listed: Vec<String> = changing
        .iter()
        .take(NOTE_MEMBERS)
        .map(|m| named(m))
        .collect();
    if changing.len() > NOTE_MEMBERS {
        listed.push(format!("and {} more", changing.len() - NOTE_MEMBERS));
    }
    let summary = format!(
        "pool {pool}: ring version {version}: {} members, {} active, {} joining, {} draining",
        topology.members.len(),
        count(MemberState::Active),
        count(MemberState::Joining),
        count(MemberState::Draining),
    );
    if listed.is_empty() {
        summary
    } else {
        format!("{summary} ({})", listed.join(", "))
    }
}

/// No member in a known zone (a test fixture).
#[cfg(test)]
pub(crate) fn no_zones() -> BTreeMap<i32, String> {
    BTreeMap::new()
}

/// Every ordinal below `shards` active (a test fixture).
#[cfg(test)]
pub(crate) fn all_active(shards: i32) -> BTreeMap<i32, MemberState> {
    (0..shards.max(0))
        .map(|ordinal| (ordinal, MemberState::Active))
        .collect()
}

/// The state of ordinal `ordinal` in `topology`, if it is a member.
pub fn state_of(
    topology: &Topology,
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    ordinal: i32,
) -> Option<MemberState> {
    let id = member_id(cluster, pool, ordinal);
    topology
        .members
        .iter()
        .find(|member| member.id == id)
        .map(|member| member.state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn members_are_the_pods_by_stable_dns_name() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let ring = plan_topology(&cluster, pool, &all_active(3), &no_zones(), None, 0);
        assert_eq!(ring.version, 1);
        assert_eq!(ring.replicas, 1);
        let ids: Vec<&str> = ring.members.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["demo-hot-0", "demo-hot-1", "demo-hot-2"]);
        assert_eq!(
            ring.members[2].address,
            "demo-hot-2.demo-hot-nodes.cache.svc.cluster.local:50051"
        );
        assert!(ring.validate().is_ok());
    }

    #[test]
    fn the_version_moves_only_when_the_ring_changes() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let first = plan_topology(&cluster, pool, &all_active(3), &no_zones(), None, 4);
        assert_eq!(first.version, 5, "above every version a node may have seen");
        let same = plan_topology(&cluster, pool, &all_active(3), &no_zones(), Some(&first), 5);
        assert_eq!(same.version, 5);
        let mut states = all_active(3);
        states.insert(1, MemberState::Draining);
        let draining = plan_topology(&cluster, pool, &states, &no_zones(), Some(&same), 5);
        assert_eq!(draining.version, 6);
        assert_eq!(
            state_of(&draining, &cluster, pool, 1),
            Some(MemberState::Draining)
        );
        let grown = plan_topology(
            &cluster,
            pool,
            &all_active(4),
            &no_zones(),
            Some(&draining),
            6,
        );
        assert_eq!(grown.version, 7);
    }

    #[test]
    fn a_ring_older_than_one_seen_is_republished_above_it() {
        let cluster = validated(&[("hot", 2)]);
        let pool = &cluster.pools[0];
        let stale = plan_topology(&cluster, pool, &all_active(2), &no_zones(), None, 0);
        // The status says nodes saw version 9 (e.g. the ConfigMap was recreated).
        let next = plan_topology(&cluster, pool, &all_active(2), &no_zones(), Some(&stale), 9);
        assert_eq!(next.version, 10);
    }

    #[test]
    fn a_small_ring_change_names_every_member() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let mut states = all_active(3);
        states.insert(2, MemberState::Draining);
        let ring = plan_topology(&cluster, pool, &states, &no_zones(), None, 6);
        assert_eq!(
            ring_changed_note("hot", &ring),
            "pool hot: ring version 7 (demo-hot-0, demo-hot-1, demo-hot-2 draining)"
        );
    }

    #[test]
    fn the_ring_change_note_of_a_maximal_pool_fits_an_event() {
        let cc = crate::simulate::maximal_cluster(256);
        let cluster = crate::validate::validate(&cc, &crate::simulate::defaults()).unwrap();
        let pool = &cluster.pools[0];
        // Every mix of states a scale-out or scale-in of 256 members goes through.
        for (active, joining) in [(256, 0), (64, 192), (255, 1), (1, 255), (0, 256)] {
            let mut states = all_active(256);
            for ordinal in active..active + joining {
                states.insert(ordinal, MemberState::Joining);
            }
            for ordinal in active + joining..256 {
                states.insert(ordinal, MemberState::Draining);
            }
            let ring = plan_topology(&cluster, pool, &states, &no_zones(), None, u64::MAX - 1);
            let note = ring_changed_note(&pool.name, &ring);
            assert!(note.len() <= 1024, "{} bytes: {note}", note.len());
            assert!(
                note.contains(&format!("256 members, {active} active, {joining} joining")),
                "{note}"
            );
        }
        let mut states = all_active(256);
        states.insert(200, MemberState::Draining);
        let ring = plan_topology(&cluster, pool, &states, &no_zones(), None, 0);
        assert!(ring_changed_note(&pool.name, &ring).ends_with(&format!(
            "1 draining ({} draining)",
            member_id(&cluster, pool, 200)
        )));
    }

    fn zones(pairs: &[(i32, &str)]) -> BTreeMap<i32, String> {
        pairs.iter().map(|(o, z)| (*o, (*z).to_owned())).collect()
    }

    #[test]
    fn a_zone_change_is_a_ring_change() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let plain = plan_topology(&cluster, pool, &all_active(3), &no_zones(), None, 0);
        assert!(plain.members.iter().all(|m| m.zone.is_none()));
        let placed = zones(&[(0, "zone-a"), (1, "zone-b"), (2, "zone-c")]);
        let zoned = plan_topology(&cluster, pool, &all_active(3), &placed, Some(&plain), 1);
        assert_eq!(zoned.version, 2, "zones appearing is a new ring");
        assert_eq!(zoned.members[1].zone.as_deref(), Some("zone-b"));
        // With two copies a zone change moves second copies (with one it moves nothing).
        let two = |t: &Topology| Topology {
            replicas: 2,
            ..t.clone()
        };
        assert!(two(&zoned).copies_moved_since(&two(&plain)));
        assert!(!zoned.copies_moved_since(&plain));
        let same = plan_topology(&cluster, pool, &all_active(3), &placed, Some(&zoned), 2);
        assert_eq!(same.version, 2);
        let moved = zones(&[(0, "zone-a"), (1, "zone-c"), (2, "zone-c")]);
        let next = plan_topology(&cluster, pool, &all_active(3), &moved, Some(&same), 2);
        assert_eq!(next.version, 3, "a member in another zone is a new ring");
        assert!(two(&next).copies_moved_since(&two(&same)));
        // Members that come or go are not zone moves.
        let grown = plan_topology(&cluster, pool, &all_active(4), &moved, Some(&next), 3);
        assert!(!two(&grown).copies_moved_since(&two(&next)));
    }

    /// A Ready pod that answered, in `zone`, running `image`, reading zones or not.
    fn sighting<'a>(
        ordinal: i32,
        zone: &'a PodZone,
        image: &'a str,
        reads: Option<bool>,
    ) -> ZoneSighting<'a> {
        ZoneSighting {
            ordinal,
            zone,
            image: Some(image),
            reads_zones: reads,
        }
    }

    #[test]
    fn zones_are_published_only_when_every_node_reads_them() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        assert!(pool.image_reads_zones, "the operator's own node image");
        let image = pool.image.as_str();
        let zone = |z: &str| PodZone::Known(Some(z.to_owned()));
        let (a, b, c) = (zone("zone-a"), zone("zone-b"), zone("zone-c"));
        let states = all_active(3);
        let all_new = [
            sighting(0, &a, image, Some(true)),
            sighting(1, &b, image, Some(true)),
            sighting(2, &c, image, None),
        ];
        assert_eq!(
            compute_zones(&cluster, pool, &states, &all_new, None),
            zones(&[(0, "zone-a"), (1, "zone-b"), (2, "zone-c")])
        );
        // An upgrade: one node still runs an image from before zones.
        let old = "flightcache/node:old";
        let mixed = [
            sighting(0, &a, image, Some(true)),
            sighting(1, &b, old, Some(false)),
            sighting(2, &c, image, Some(true)),
        ];
        assert!(compute_zones(&cluster, pool, &states, &mixed, None).is_empty());
        // ... or is not Ready to say: its image is not known to read zones.
        let unready_old = [
            sighting(0, &a, image, Some(true)),
            sighting(1, &b, old, None),
        ];
        assert!(!zones_readable(pool, &unready_old));
    }

    #[test]
    fn another_image_reads_zones_once_a_node_running_it_says_so() {
        let mut cc = crate::validate::fixtures::cluster(&[("hot", 2)]);
        cc.spec.pools[0].image = Some("flightcache/node:custom".into());
        let cluster =
            crate::validate::validate(&cc, &crate::validate::fixtures::defaults()).unwrap();
        let pool = &cluster.pools[0];
        assert!(!pool.image_reads_zones);
        let a = PodZone::Known(Some("zone-a".into()));
        let custom = "flightcache/node:custom";
        assert!(!zones_readable(pool, &[sighting(0, &a, custom, None)]));
        assert!(zones_readable(
            pool,
            &[
                sighting(0, &a, custom, Some(true)),
                sighting(1, &a, custom, None)
            ]
        ));
        // A downgrade: the pool names an image no node has vouched for, so zones go
        // before its first pod starts (an older node would refuse the ring at start).
        let mut cc = cc.clone();
        cc.spec.pools[0].image = Some("flightcache/node:older".into());
        let cluster =
            crate::validate::validate(&cc, &crate::validate::fixtures::defaults()).unwrap();
        assert!(!zones_readable(
            &cluster.pools[0],
            &[
                sighting(0, &a, custom, Some(true)),
                sighting(1, &a, custom, Some(true))
            ]
        ));
    }

    #[test]
    fn an_unknown_zone_keeps_the_one_published_and_a_bad_one_is_dropped() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let image = pool.image.as_str();
        let states = all_active(3);
        let published = plan_topology(
            &cluster,
            pool,
            &states,
            &zones(&[(0, "zone-a"), (1, "zone-b")]),
            None,
            0,
        );
        let (unknown, none, empty) = (
            PodZone::Unknown,
            PodZone::Known(None),
            PodZone::Known(Some(String::new())),
        );
        let sightings = [
            // Restarting (not scheduled yet), or its Node unreadable.
            sighting(0, &unknown, image, None),
            // Its Node has no zone label: known to be in none.
            sighting(1, &none, image, Some(true)),
            sighting(2, &empty, image, Some(true)),
        ];
        assert_eq!(
            compute_zones(&cluster, pool, &states, &sightings, Some(&published)),
            zones(&[(0, "zone-a")])
        );
        // Without a ring published before, an unknown zone is none.
        assert!(compute_zones(&cluster, pool, &states, &sightings, None).is_empty());
    }

    #[test]
    fn ordinals_come_from_pod_names() {
        assert_eq!(ordinal_of("analytics-hot-12"), Some(12));
        assert_eq!(ordinal_of("analytics-hot"), None);
    }
}
