//! The ring a pool's nodes route by, as the operator publishes it. Pure.
//!
//! Members are the StatefulSet's pods, identified by their stable names
//! (`<cluster>-<pool>-<ordinal>`) and addressed by their stable DNS names through the
//! headless Service, so a restarted pod keeps its identity and its keys. The version
//! moves forward exactly when the members, their states or the replica count change,
//! and never below a version a node may already have seen (the ConfigMap's and the
//! status's), so nodes accept every new ring and refuse stale ones.
//!
//! Owns: member ids, addresses and states as published. Must not import kube's client,
//! tokio or any I/O (checked by `scripts/check-layers`); imports `build::names` and
//! `validate` only.

use std::collections::BTreeMap;

use crds::node_config::{MemberState, Topology, TopologyMember};

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

/// The ring of `pool` with the given member states (by ordinal), versioned after
/// `previous` (the ring last published, if any) and never at or below `seen` unless it
/// equals `previous`.
pub fn plan_topology(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    states: &BTreeMap<i32, MemberState>,
    previous: Option<&Topology>,
    seen: u64,
) -> Topology {
    let members = states
        .iter()
        .map(|(&ordinal, &state)| TopologyMember {
            id: member_id(cluster, pool, ordinal),
            address: member_address(cluster, pool, ordinal),
            state,
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

/// Whether two rings route the same way (members, addresses, states and replicas; the
/// member order does not matter).
pub fn same_ring(a: &Topology, b: &Topology) -> bool {
    let key = |t: &Topology| {
        let mut members: Vec<(String, String, MemberState)> = t
            .members
            .iter()
            .map(|m| (m.id.clone(), m.address.clone(), m.state))
            .collect();
        members.sort_by(|x, y| x.0.cmp(&y.0));
        (t.replicas, members)
    };
    key(a) == key(b)
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
        let ring = plan_topology(&cluster, pool, &all_active(3), None, 0);
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
        let first = plan_topology(&cluster, pool, &all_active(3), None, 4);
        assert_eq!(first.version, 5, "above every version a node may have seen");
        let same = plan_topology(&cluster, pool, &all_active(3), Some(&first), 5);
        assert_eq!(same.version, 5);
        let mut states = all_active(3);
        states.insert(1, MemberState::Draining);
        let draining = plan_topology(&cluster, pool, &states, Some(&same), 5);
        assert_eq!(draining.version, 6);
        assert_eq!(
            state_of(&draining, &cluster, pool, 1),
            Some(MemberState::Draining)
        );
        let grown = plan_topology(&cluster, pool, &all_active(4), Some(&draining), 6);
        assert_eq!(grown.version, 7);
    }

    #[test]
    fn a_ring_older_than_one_seen_is_republished_above_it() {
        let cluster = validated(&[("hot", 2)]);
        let pool = &cluster.pools[0];
        let stale = plan_topology(&cluster, pool, &all_active(2), None, 0);
        // The status says nodes saw version 9 (e.g. the ConfigMap was recreated).
        let next = plan_topology(&cluster, pool, &all_active(2), Some(&stale), 9);
        assert_eq!(next.version, 10);
    }

    #[test]
    fn a_small_ring_change_names_every_member() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let mut states = all_active(3);
        states.insert(2, MemberState::Draining);
        let ring = plan_topology(&cluster, pool, &states, None, 6);
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
            let ring = plan_topology(&cluster, pool, &states, None, u64::MAX - 1);
            let note = ring_changed_note(&pool.name, &ring);
            assert!(note.len() <= 1024, "{} bytes: {note}", note.len());
            assert!(
                note.contains(&format!("256 members, {active} active, {joining} joining")),
                "{note}"
            );
        }
        let mut states = all_active(256);
        states.insert(200, MemberState::Draining);
        let ring = plan_topology(&cluster, pool, &states, None, 0);
        assert!(ring_changed_note(&pool.name, &ring).ends_with(&format!(
            "1 draining ({} draining)",
            member_id(&cluster, pool, 200)
        )));
    }

    #[test]
    fn ordinals_come_from_pod_names() {
        assert_eq!(ordinal_of("analytics-hot-12"), Some(12));
        assert_eq!(ordinal_of("analytics-hot"), None);
    }
}
