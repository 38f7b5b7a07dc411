//! The topology a node routes by: the published ring (members, addresses, states,
//! version) turned into a [`Ring`], and the node's current [`RoutingTable`].
//!
//! The topology arrives at the edge: the `topology` field of the config file (the
//! operator's ConfigMap, so a restarted node starts with it), the `configure` action, or a
//! static `--topology FILE` in local mode. The table never goes back to an older ring
//! version: an older document is refused, the same version is accepted only unchanged.
//! Without a topology the node owns every key (one node, as before routing existed).
//! No I/O; the table is shared behind a lock that is never held across an `.await`.
//!
//! Owns: the installed topology and routing decisions, with their own [`RoutingError`].
//! Must not import tonic, `crate::error` (the gRPC-aware error) or `flight/`.

use std::sync::Arc;

use crds::node_config::{self, Topology};
use parking_lot::RwLock;

/// Why the ring refused a topology or cannot route a request. Knows nothing of gRPC:
/// `error.rs` maps it to a status.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// The topology document is inconsistent (the source names what is wrong).
    #[error("topology rejected")]
    TopologyRejected(#[source] node_config::NodeConfigError),
    /// A topology version older than the running one (or the running version changed).
    #[error(
        "topology version {requested} is not newer than the running ring version {running} (an \
         older version, or the same version with different members); publish a new version"
    )]
    StaleTopology {
        /// The version offered.
        requested: u64,
        /// The version running.
        running: u64,
    },
    /// The ring has no active member to own the key.
    #[error("ring version {version} has no active member to own this key")]
    NoOwner {
        /// The ring version.
        version: u64,
    },
    /// A forwarded request reached a node whose ring names another owner.
    #[error(
        "ring disagreement: {from} (ring version {from_version}) forwarded this request here, but \
         ring version {version} on this node names {owner} as the owner; retry once the \
         topology has reached every node"
    )]
    RingDisagreement {
        /// The forwarding member.
        from: String,
        /// The ring version it routed by.
        from_version: u64,
        /// The owner by this node's ring.
        owner: String,
        /// This node's ring version.
        version: u64,
    },
}

/// Result with [`RoutingError`].
pub type Result<T, E = RoutingError> = std::result::Result<T, E>;
use crate::routing::ring::{MemberId, MemberState, Ring, RingMember};
use RoutingError as Error;

/// A ring member a request can be forwarded to.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The member id (pod name).
    pub id: MemberId,
    /// Its Flight address, `host:port`.
    pub address: String,
    /// The version of the ring it was chosen by: what a request forwarded to it names as
    /// the ring it was routed by. A ring installed between the choice and the send must
    /// not be claimed instead: the receiver, on that newer ring, would find the request
    /// routed by it to a node it does not own and refuse it (`RingDisagreement`, a CI run's
    /// one failed call as a frozen owner came back into the ring).
    pub ring_version: u64,
}

/// The same member at the same address, whichever ring version each was chosen by.
impl PartialEq for Peer {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.address == other.address
    }
}

impl Eq for Peer {}

/// Where a request for a key is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node owns the key (or there is no topology).
    Local,
    /// Another member owns it: forward there.
    Forward(Peer),
}

/// A validated topology: the ring plus each member's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    ring: Ring,
    topology: Topology,
}

impl Membership {
    /// Builds the ring of a validated topology.
    ///
    /// # Errors
    /// [`Error::TopologyRejected`] when the document is inconsistent.
    pub fn new(topology: Topology) -> Result<Self> {
        topology.validate().map_err(Error::TopologyRejected)?;
        let members = topology
            .members
            .iter()
            .map(|member| {
                RingMember::new(member.id.clone(), member.state).with_zone(member.zone.clone())
            })
            .collect();
        Ok(Self {
            ring: Ring::new(topology.version, members),
            topology,
        })
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The document it was built from.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Copies of each key (1 or 2): a key lives on its first `replicas` choices.
    pub fn replicas(&self) -> usize {
        usize::from(self.topology.replicas.max(1))
    }

    /// The members that hold `key` (store bytes), best first: its first
    /// [`replicas`](Self::replicas) active choices.
    pub fn owners(&self, key: &[u8]) -> Vec<&MemberId> {
        self.ring.owners(key, self.replicas())
    }

    /// The members that hold `key` (store bytes) once `leaving` has left the ring (is
    /// draining): where its copy goes when it hands its entries off.
    pub fn owners_without(&self, key: &[u8], leaving: &str) -> Vec<&MemberId> {
        self.ring.owners_without(key, self.replicas(), leaving)
    }

    /// Where `key` (store bytes) is found while its holder `away` cannot be reached or
    /// is stopping: of the key's holders once `away` has left the ring, one that holds
    /// a copy already (with two copies, the other copy: reads try it first, and with
    /// zones it sits in another zone, so it survives the loss of `away`'s), else the
    /// first (with one copy, the member that owns the key when the operator takes `away`
    /// out of the ring). `None` when no other member is active.
    ///
    /// Without zones this is the key's second ring choice, as before zones existed.
    pub fn stand_in(&self, key: &[u8], away: &str) -> Option<&MemberId> {
        let holders = self.owners(key);
        let after = self.owners_without(key, away);
        after
            .iter()
            .find(|id| holders.contains(*id))
            .or_else(|| after.first())
            .copied()
    }

    /// The member with `id`, with its address.
    pub fn peer(&self, id: &str) -> Option<Peer> {
        self.topology
            .members
            .iter()
            .find(|member| member.id == id)
            .map(|member| Peer {
                id: member.id.clone(),
                address: member.address.clone(),
                ring_version: self.ring.version(),
            })
    }
}

/// Who sent a forwarded request, read from its headers (see `cluster::forward`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardedBy {
    /// The forwarding member's id.
    pub member: String,
    /// The ring version it routed by.
    pub ring_version: u64,
}

/// Decides where a key is served: the first of [`choices`]. Pure.
///
/// # Errors
/// As [`choices`].
pub fn decide(
    membership: Option<&Membership>,
    self_id: Option<&str>,
    key: &[u8],
    forwarded: Option<&ForwardedBy>,
) -> Result<Route> {
    let mut choices = choices(membership, self_id, key, forwarded)?;
    // `choices` never returns an empty list.
    Ok(if choices.is_empty() {
        Route::Local
    } else {
        choices.swap_remove(0)
    })
}

/// Where a key is held, best first: one route per copy (the owner, then with
/// `replicas: 2` its second choice), each [`Route::Local`] for this node or a
/// [`Route::Forward`] to the member. Never empty. Pure.
///
/// A request that was already forwarded is never forwarded again: it is served here
/// ([`Route::Local`] alone) when this node holds a copy of the key, or when the sender
/// routed by another ring version than ours. That happens for a moment while a new ring
/// reaches the nodes one by one; a cache answers it from what it holds (a hit, or a miss
/// the client refills, and a stray entry the next rebalance moves) rather than failing
/// the call. Only two nodes on the same ring version that disagree refuse the request
/// with UNAVAILABLE: that is a bug, not a transition.
///
/// # Errors
/// [`Error::NoOwner`] when no member is active, [`Error::RingDisagreement`] as above.
pub fn choices(
    membership: Option<&Membership>,
    self_id: Option<&str>,
    key: &[u8],
    forwarded: Option<&ForwardedBy>,
) -> Result<Vec<Route>> {
    let Some(membership) = membership else {
        return Ok(vec![Route::Local]);
    };
    let version = membership.ring.version();
    let owners = membership.owners(key);
    let Some(&owner) = owners.first() else {
        return Err(Error::NoOwner { version });
    };
    let is_self = |id: &MemberId| Some(id.as_str()) == self_id;
    if let Some(by) = forwarded {
        if owners.iter().any(|id| is_self(id)) || by.ring_version != version {
            return Ok(vec![Route::Local]);
        }
        return Err(Error::RingDisagreement {
            from: by.member.clone(),
            from_version: by.ring_version,
            owner: owner.clone(),
            version,
        });
    }
    owners
        .into_iter()
        .map(|id| {
            if is_self(id) {
                Ok(Route::Local)
            } else {
                membership
                    .peer(id)
                    .map(Route::Forward)
                    .ok_or(Error::NoOwner { version })
            }
        })
        .collect()
}

/// The members that held `key` (store bytes) under `previous` but do not under `current`
/// and are still members of `current`, draining (a draining member still holds its keys
/// until it has handed them over), except `self_id`, with their current address, in
/// `previous`'s order. A member that left the ring is not asked: its keys were handed
/// over while it drained, and it may be gone. Nor is one now `joining`: a member goes
/// from owning keys back to joining only when the operator took it out of the key space
/// because it could not be reached (hung, its node lost or cut off), and what it still
/// holds may since have been overwritten or invalidated on the others — asked before
/// it has the ring that makes it drop those entries, it would hand back an old value.
/// Pure.
pub fn previous_holders(
    previous: &Membership,
    current: &Membership,
    self_id: Option<&str>,
    key: &[u8],
) -> Vec<Peer> {
    let now_held = current.owners(key);
    let taken_out = |id: &MemberId| {
        current
            .ring
            .member(id)
            .is_some_and(|member| member.state() == MemberState::Joining)
    };
    previous
        .owners(key)
        .into_iter()
        .filter(|id| Some(id.as_str()) != self_id && !now_held.contains(id) && !taken_out(id))
        .filter_map(|id| current.peer(id))
        .collect()
}

/// Where a key that `self_id` holds a copy of lives while that node is away: the holder
/// the key gains once the node has left the ring (where its exit handoff copied it, and,
/// with one copy, where writes went while it could not be reached; with two, those went
/// to the other copy, which is asked anyway). Without zones, the key's first ring choice
/// after its copies. `None` when `self_id` holds no copy. Pure.
pub fn holder_while_away(current: &Membership, self_id: Option<&str>, key: &[u8]) -> Option<Peer> {
    let id = self_id?;
    let holders = current.owners(key);
    if !holders.iter().any(|holder| holder.as_str() == id) {
        return None;
    }
    let next = current
        .owners_without(key, id)
        .into_iter()
        .find(|member| !holders.contains(member))?;
    current.peer(next)
}

/// How long after a ring change a miss asks the key's previous holders: the operator's
/// rebalance deadline (120 s), by which every previous holder has handed its keys over.
pub const MOVE_WINDOW: std::time::Duration = std::time::Duration::from_secs(120);

/// What installing a topology did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// A newer version now routes.
    Applied {
        /// The version now running.
        version: u64,
    },
    /// The same version was already running.
    Unchanged {
        /// The version running.
        version: u64,
    },
}

/// The node's identity and current ring; shared by every request.
#[derive(Debug)]
pub struct RoutingTable {
    self_id: Option<MemberId>,
    current: RwLock<Option<Arc<Membership>>>,
    /// The ring the current one replaced, and when: asked on a miss during the move.
    previous: RwLock<Option<(Arc<Membership>, std::time::Instant)>>,
    move_window: std::time::Duration,
    /// When this node started: within the move window of it, a miss also asks the key's
    /// next holder after its copies, where this node's entries went while it was away
    /// (its exit handoff, fallback writes).
    started: std::time::Instant,
    /// The version of the last ring installed that asked this node to hand off
    /// ([`Topology::asks_handoff_of`]; 0: none): it owes a handover until a whole
    /// rebalance on that ring or a later one has sent everything.
    handoff_asked_at: std::sync::atomic::AtomicU64,
}

impl RoutingTable {
    /// A table for member `self_id` starting with `initial` (or no topology).
    ///
    /// # Errors
    /// [`Error::TopologyRejected`] for an inconsistent topology.
    pub fn new(self_id: Option<MemberId>, initial: Option<Topology>) -> Result<Self> {
        let current = initial.map(Membership::new).transpose()?.map(Arc::new);
        Ok(Self {
            self_id,
            current: RwLock::new(current),
            previous: RwLock::new(None),
            move_window: MOVE_WINDOW,
            started: std::time::Instant::now(),
            handoff_asked_at: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// This table, asking previous holders for `window` after a ring change.
    #[must_use]
    pub fn with_move_window(mut self, window: std::time::Duration) -> Self {
        self.move_window = window;
        self
    }

    /// The members that held `key` (store bytes) before the last ring change and may
    /// still hold it, while that change is less than the move window old; see
    /// [`previous_holders`]. Empty outside a move.
    ///
    /// Within the move window of this node's start, when it holds a copy of the key, the
    /// key's next choice after its copies is asked too: where the key went while this
    /// node was away (its exit handoff, writes made while it could not be reached).
    pub fn previous_holders(&self, key: &[u8]) -> Vec<Peer> {
        let Some(current) = self.current() else {
            return Vec::new();
        };
        let mut holders = match self.previous.read().clone() {
            Some((previous, since)) if since.elapsed() < self.move_window => {
                previous_holders(&previous, &current, self.self_id(), key)
            }
            _ => Vec::new(),
        };
        if self.started.elapsed() < self.move_window
            && let Some(away) = holder_while_away(&current, self.self_id(), key)
            && !holders.contains(&away)
        {
            holders.push(away);
        }
        holders
    }

    /// The membership routing now with this node draining: where the keys it holds go
    /// once it has left. `None` without a ring or membership, or when no other member
    /// is active.
    pub fn without_self(&self) -> Option<Membership> {
        let current = self.current()?;
        let id = self.self_id()?;
        let mut topology = current.topology().clone();
        let member = topology.members.iter_mut().find(|member| member.id == id)?;
        member.state = node_config::MemberState::Draining;
        let leaving = Membership::new(topology).ok()?;
        // Some key has an owner only while another member is active.
        (!leaving.ring.owners(b"", 1).is_empty()).then_some(leaving)
    }

    /// This node's member id, if it has one.
    pub fn self_id(&self) -> Option<&str> {
        self.self_id.as_deref()
    }

    /// The membership routing now, if any.
    pub fn current(&self) -> Option<Arc<Membership>> {
        self.current.read().clone()
    }

    /// The version of the last ring installed that asked this node to hand off (0: none
    /// since it started): see [`Topology::asks_handoff_of`].
    pub fn handoff_asked_at(&self) -> u64 {
        self.handoff_asked_at
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The ring version routing now (0 without a topology).
    pub fn version(&self) -> u64 {
        self.current
            .read()
            .as_ref()
            .map_or(0, |membership| membership.ring.version())
    }

    /// Where `key` (store bytes) is served.
    ///
    /// # Errors
    /// See [`decide`].
    pub fn route(&self, key: &[u8], forwarded: Option<&ForwardedBy>) -> Result<Route> {
        let current = self.current();
        decide(current.as_deref(), self.self_id(), key, forwarded)
    }

    /// Where `key` (store bytes) is held, best first; see [`choices`].
    ///
    /// # Errors
    /// See [`choices`].
    pub fn choices(&self, key: &[u8], forwarded: Option<&ForwardedBy>) -> Result<Vec<Route>> {
        let current = self.current();
        choices(current.as_deref(), self.self_id(), key, forwarded)
    }

    /// The key's (store bytes) next candidate, its owner's stand-in
    /// ([`Membership::stand_in`]; without zones its second ring choice): where a write
    /// goes while the owner cannot be reached, and where a read looks when no copy could
    /// be reached. `None` without a topology or with one active member.
    pub fn next_candidate(&self, key: &[u8]) -> Option<Route> {
        let current = self.current()?;
        let owner = current.owners(key).first().copied()?;
        let id = current.stand_in(key, owner)?;
        if Some(id.as_str()) == self.self_id() {
            Some(Route::Local)
        } else {
            current.peer(id).map(Route::Forward)
        }
    }

    /// This node's own address in the topology (for GetFlightInfo locations).
    pub fn self_address(&self) -> Option<String> {
        let current = self.current()?;
        current.peer(self.self_id()?).map(|peer| peer.address)
    }

    /// Checks that `topology` could be installed now, without installing it.
    ///
    /// # Errors
    /// As [`RoutingTable::install`].
    pub fn check(&self, topology: &Topology) -> Result<Membership> {
        let next = Membership::new(topology.clone())?;
        if let Some(current) = self.current.read().as_ref() {
            ensure_not_older(current, &next)?;
        }
        Ok(next)
    }

    /// This node's state in the running ring (`None`: no ring, or not a member).
    pub fn self_state(&self) -> Option<MemberState> {
        let id = self.self_id()?;
        let current = self.current()?;
        current.ring.member(id).map(|member| member.state())
    }

    /// Installs `topology` unless it is older than the running one.
    ///
    /// # Errors
    /// [`Error::TopologyRejected`] for an inconsistent document, [`Error::StaleTopology`]
    /// for an older version or the running version with different members.
    pub fn install(&self, topology: &Topology) -> Result<Installed> {
        let next = Membership::new(topology.clone())?;
        let version = next.ring.version();
        let mut current = self.current.write();
        if let Some(running) = current.as_ref() {
            ensure_not_older(running, &next)?;
            if running.ring.version() == version {
                return Ok(Installed::Unchanged { version });
            }
        }
        let owns = self
            .self_id()
            .and_then(|id| next.ring.member(id))
            .map(|member| member.state());
        tracing::info!(
            version,
            members = next.ring.members().len(),
            self_state = ?owns,
            "installed ring topology"
        );
        if let (Some(running), Some(id)) = (current.as_ref(), self.self_id())
            && next.topology.asks_handoff_of(&running.topology, id)
        {
            // The operator asks for this rebalance in the pass that publishes the ring;
            // saying so here asks again should that call not come or not send everything.
            self.handoff_asked_at
                .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
        }
        let next = Arc::new(next);
        if let Some(replaced) = current.replace(Arc::clone(&next)) {
            // A new version that moves no key (same members, states and replicas: only
            // addresses or the version changed) keeps the ring before it as the previous
            // one, so keys still on the move stay findable.
            let moves_keys = replaced.ring.members() != next.ring.members()
                || replaced.replicas() != next.replicas();
            if moves_keys {
                *self.previous.write() = Some((replaced, std::time::Instant::now()));
            }
        }
        Ok(Installed::Applied { version })
    }
}

fn ensure_not_older(running: &Membership, next: &Membership) -> Result<()> {
    let (have, want) = (running.ring.version(), next.ring.version());
    if want < have || (want == have && running.topology != next.topology) {
        return Err(Error::StaleTopology {
            requested: want,
            running: have,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::node_config::TopologyMember;

    use super::*;

    fn topology(version: u64, states: &[(&str, node_config::MemberState)]) -> Topology {
        Topology {
            version,
            replicas: 1,
            members: states
                .iter()
                .enumerate()
                .map(|(i, (id, state))| TopologyMember {
                    id: (*id).to_owned(),
                    address: format!("127.0.0.1:{}", 50051 + i),
                    state: *state,
                    zone: None,
                })
                .collect(),
        }
    }

    fn three(version: u64) -> Topology {
        use node_config::MemberState::Active;
        topology(
            version,
            &[("n-0", Active), ("n-1", Active), ("n-2", Active)],
        )
    }

    /// A key owned by `owner` in `membership`.
    fn key_owned_by(membership: &Membership, owner: &str) -> Vec<u8> {
        (0..)
            .map(|i| format!("Pk{i}").into_bytes())
            .find(|key| membership.ring().owner(key).map(String::as_str) == Some(owner))
            .unwrap()
    }

    #[test]
    fn without_a_topology_everything_is_local() {
        assert_eq!(decide(None, None, b"Pa", None).unwrap(), Route::Local);
        let table = RoutingTable::new(Some("n-0".into()), None).unwrap();
        assert_eq!(table.route(b"Pa", None).unwrap(), Route::Local);
        assert_eq!(table.version(), 0);
    }

    #[test]
    fn keys_of_other_members_are_forwarded_to_their_address() {
        let membership = Membership::new(three(1)).unwrap();
        let mine = key_owned_by(&membership, "n-0");
        let theirs = key_owned_by(&membership, "n-2");
        let route = |key: &[u8]| decide(Some(&membership), Some("n-0"), key, None).unwrap();
        assert_eq!(route(&mine), Route::Local);
        assert_eq!(
            route(&theirs),
            Route::Forward(Peer {
                id: "n-2".into(),
                address: "127.0.0.1:50053".into(),
                ring_version: 1,
            })
        );
        let Route::Forward(peer) = route(&theirs) else {
            unreachable!("forwarded above")
        };
        assert_eq!(peer.ring_version, membership.ring().version());
    }

    #[test]
    fn a_peer_names_the_ring_that_chose_it_though_a_newer_one_came_before_the_send() {
        // n-0 routes a key to its owner n-1 by ring 1; ring 2 (n-3 joins and takes the key)
        // is installed on n-0 before the request leaves, and n-1 already runs it.
        let table = RoutingTable::new(Some("n-0".into()), Some(three(1))).unwrap();
        let (before, after) = (
            Membership::new(three(1)).unwrap(),
            Membership::new(four(2)).unwrap(),
        );
        let moved = key_moved(&before, &after, "n-1", "n-3");
        let Route::Forward(peer) = table.route(&moved, None).unwrap() else {
            unreachable!("n-1 owns the key in ring 1")
        };
        table.install(&four(2)).unwrap();
        assert_eq!((peer.id.as_str(), peer.ring_version), ("n-1", 1));
        assert_eq!(table.version(), 2);
        // Named by the ring that chose n-1, the request is answered from what n-1 holds;
        // naming the ring installed since, n-1 would refuse it as a disagreement.
        let by = |ring_version| ForwardedBy {
            member: "n-0".into(),
            ring_version,
        };
        let at_n1 = |by: &ForwardedBy| choices(Some(&after), Some("n-1"), &moved, Some(by));
        assert_eq!(at_n1(&by(peer.ring_version)).unwrap(), vec![Route::Local]);
        assert!(matches!(
            at_n1(&by(table.version())),
            Err(Error::RingDisagreement { .. })
        ));
    }

    #[test]
    fn a_forwarded_request_is_never_forwarded_again() {
        let membership = Membership::new(three(3)).unwrap();
        let theirs = key_owned_by(&membership, "n-2");
        let by = |ring_version| ForwardedBy {
            member: "n-1".into(),
            ring_version,
        };
        let err = decide(Some(&membership), Some("n-0"), &theirs, Some(&by(3))).unwrap_err();
        assert!(matches!(err, Error::RingDisagreement { .. }), "{err}");
        assert!(err.to_string().contains("n-2"), "{err}");
        assert_eq!(
            crate::error::Error::from(err).code(),
            tonic::Code::Unavailable
        );
        // The sender has a newer ring: trust it and serve here.
        assert_eq!(
            decide(Some(&membership), Some("n-0"), &theirs, Some(&by(4))).unwrap(),
            Route::Local
        );
        // An older one (a new ring is still reaching the nodes): serve here too, a hit
        // or a miss, never an error.
        assert_eq!(
            decide(Some(&membership), Some("n-0"), &theirs, Some(&by(2))).unwrap(),
            Route::Local
        );
    }

    #[test]
    fn with_two_replicas_a_key_has_two_choices_and_both_serve_forwarded_requests() {
        let mut doc = three(4);
        doc.replicas = 2;
        let membership = Membership::new(doc).unwrap();
        let key = key_owned_by(&membership, "n-0");
        let second = membership.owners(&key)[1].clone();
        let third = ["n-1", "n-2"].into_iter().find(|id| *id != second).unwrap();
        let peer = |id: &str| Route::Forward(membership.peer(id).unwrap());
        assert_eq!(
            choices(Some(&membership), Some("n-0"), &key, None).unwrap(),
            vec![Route::Local, peer(&second)]
        );
        assert_eq!(
            choices(Some(&membership), Some(&second), &key, None).unwrap(),
            vec![peer("n-0"), Route::Local]
        );
        assert_eq!(
            choices(Some(&membership), Some(third), &key, None).unwrap(),
            vec![peer("n-0"), peer(&second)]
        );
        let by = ForwardedBy {
            member: "n-0".into(),
            ring_version: 4,
        };
        assert_eq!(
            choices(Some(&membership), Some(&second), &key, Some(&by)).unwrap(),
            vec![Route::Local]
        );
        assert!(choices(Some(&membership), Some(third), &key, Some(&by)).is_err());
    }

    #[test]
    fn a_ring_without_active_members_answers_unavailable() {
        use node_config::MemberState::Joining;
        let membership = Membership::new(topology(1, &[("n-0", Joining)])).unwrap();
        let err = decide(Some(&membership), Some("n-0"), b"Pa", None).unwrap_err();
        assert_eq!(
            crate::error::Error::from(err).code(),
            tonic::Code::Unavailable
        );
    }

    #[test]
    fn versions_only_move_forward() {
        let table = RoutingTable::new(Some("n-0".into()), Some(three(2))).unwrap();
        assert_eq!(
            table.install(&three(2)).unwrap(),
            Installed::Unchanged { version: 2 }
        );
        let err = table.install(&three(1)).unwrap_err();
        assert!(matches!(
            err,
            Error::StaleTopology {
                requested: 1,
                running: 2
            }
        ));
        let mut changed = three(2);
        changed.members.pop();
        assert!(matches!(
            table.install(&changed).unwrap_err(),
            Error::StaleTopology { .. }
        ));
        assert_eq!(
            table.install(&three(5)).unwrap(),
            Installed::Applied { version: 5 }
        );
        assert_eq!(table.version(), 5);
        assert_eq!(table.self_address().as_deref(), Some("127.0.0.1:50051"));
    }

    fn four(version: u64) -> Topology {
        use node_config::MemberState::Active;
        topology(
            version,
            &[
                ("n-0", Active),
                ("n-1", Active),
                ("n-2", Active),
                ("n-3", Active),
            ],
        )
    }

    /// A key whose owner is `before` in `previous` and `after` in `current`.
    fn key_moved(
        previous: &Membership,
        current: &Membership,
        before: &str,
        after: &str,
    ) -> Vec<u8> {
        (0..)
            .map(|i| format!("Pm{i}").into_bytes())
            .find(|key| {
                previous.ring().owner(key).map(String::as_str) == Some(before)
                    && current.ring().owner(key).map(String::as_str) == Some(after)
            })
            .unwrap()
    }

    #[test]
    fn after_a_scale_out_a_new_owner_asks_the_keys_previous_holder() {
        let (before, after) = (
            Membership::new(three(1)).unwrap(),
            Membership::new(four(2)).unwrap(),
        );
        let moved = key_moved(&before, &after, "n-1", "n-3");
        let holders = previous_holders(&before, &after, Some("n-3"), &moved);
        assert_eq!(
            holders,
            vec![Peer {
                id: "n-1".into(),
                address: "127.0.0.1:50052".into(),
                ring_version: 1,
            }]
        );
        // A key that did not move has no previous holder to ask.
        let stayed = key_moved(&before, &after, "n-1", "n-1");
        assert!(previous_holders(&before, &after, Some("n-3"), &stayed).is_empty());
        // Nor does the previous holder itself.
        assert!(previous_holders(&before, &after, Some("n-1"), &moved).is_empty());
    }

    #[test]
    fn a_draining_member_is_asked_and_one_that_left_the_ring_is_not() {
        use node_config::MemberState::{Active, Draining};
        let (before, draining) = (
            Membership::new(four(1)).unwrap(),
            Membership::new(topology(
                2,
                &[
                    ("n-0", Active),
                    ("n-1", Active),
                    ("n-2", Active),
                    ("n-3", Draining),
                ],
            ))
            .unwrap(),
        );
        let target = draining
            .ring()
            .owner(&key_owned_by(&before, "n-3"))
            .cloned();
        let moved = key_owned_by(&before, "n-3");
        let new_owner = target.unwrap();
        let holders = previous_holders(&before, &draining, Some(&new_owner), &moved);
        assert_eq!(
            holders.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["n-3"]
        );
        // Once n-3 has left the ring it is no longer asked.
        let left = Membership::new(three(3)).unwrap();
        assert!(previous_holders(&before, &left, Some(&new_owner), &moved).is_empty());
    }

    #[test]
    fn a_member_taken_out_of_the_key_space_is_not_asked_for_what_it_held() {
        use node_config::MemberState::{Active, Joining};
        // n-3 could not be reached (hung, its node lost or cut off): the operator published
        // it joining. Its old copies may be stale; it must not be asked for them.
        let before = Membership::new(four(1)).unwrap();
        let taken_out = Membership::new(topology(
            2,
            &[
                ("n-0", Active),
                ("n-1", Active),
                ("n-2", Active),
                ("n-3", Joining),
            ],
        ))
        .unwrap();
        let moved = key_owned_by(&before, "n-3");
        let new_owner = taken_out.ring().owner(&moved).cloned().unwrap();
        assert!(previous_holders(&before, &taken_out, Some(&new_owner), &moved).is_empty());
    }

    #[test]
    fn previous_holders_are_asked_only_within_the_move_window() {
        let table = RoutingTable::new(Some("n-3".into()), Some(three(1))).unwrap();
        let (before, after) = (
            Membership::new(three(1)).unwrap(),
            Membership::new(four(2)).unwrap(),
        );
        let moved = key_moved(&before, &after, "n-1", "n-3");
        assert!(
            table.previous_holders(&moved).is_empty(),
            "no ring change yet"
        );
        table.install(&four(2)).unwrap();
        assert_eq!(table.previous_holders(&moved)[0].id, "n-1");

        let closed = RoutingTable::new(Some("n-3".into()), Some(three(1)))
            .unwrap()
            .with_move_window(std::time::Duration::ZERO);
        closed.install(&four(2)).unwrap();
        assert!(
            closed.previous_holders(&moved).is_empty(),
            "the window has passed"
        );
    }

    #[test]
    fn a_node_that_just_started_asks_where_its_keys_went_while_it_was_away() {
        let membership = Membership::new(three(1)).unwrap();
        let mine = key_owned_by(&membership, "n-0");
        let theirs = key_owned_by(&membership, "n-2");
        let next = membership.ring().owners(&mine, 2)[1].clone();
        let away = holder_while_away(&membership, Some("n-0"), &mine).unwrap();
        assert_eq!(away.id, next);
        assert!(holder_while_away(&membership, Some("n-0"), &theirs).is_none());

        let fresh = RoutingTable::new(Some("n-0".into()), Some(three(1))).unwrap();
        assert_eq!(fresh.previous_holders(&mine), vec![away]);
        assert!(fresh.previous_holders(&theirs).is_empty());
        let long_running = RoutingTable::new(Some("n-0".into()), Some(three(1)))
            .unwrap()
            .with_move_window(std::time::Duration::ZERO);
        assert!(long_running.previous_holders(&mine).is_empty());
    }

    #[test]
    fn leaving_sends_a_nodes_keys_to_their_next_choice() {
        let table = RoutingTable::new(Some("n-0".into()), Some(three(1))).unwrap();
        let current = table.current().unwrap();
        let mine = key_owned_by(&current, "n-0");
        let leaving = table.without_self().unwrap();
        assert_eq!(
            leaving.owners(&mine),
            vec![current.ring().owners(&mine, 2)[1]]
        );
        // Alone in its ring, a node has nowhere to go.
        let alone = RoutingTable::new(
            Some("n-0".into()),
            Some(topology(1, &[("n-0", node_config::MemberState::Active)])),
        )
        .unwrap();
        assert!(alone.without_self().is_none());
        assert!(
            RoutingTable::new(None, Some(three(1)))
                .unwrap()
                .without_self()
                .is_none()
        );
    }

    #[test]
    fn a_version_that_moves_no_key_keeps_the_previous_ring() {
        let table = RoutingTable::new(Some("n-3".into()), Some(three(1))).unwrap();
        let (before, after) = (
            Membership::new(three(1)).unwrap(),
            Membership::new(four(2)).unwrap(),
        );
        let moved = key_moved(&before, &after, "n-1", "n-3");
        table.install(&four(2)).unwrap();
        // v3: the same members and states, a new address for one of them.
        let mut readdressed = four(3);
        readdressed.members[1].address = "127.0.0.1:60000".into();
        table.install(&readdressed).unwrap();
        let holders = table.previous_holders(&moved);
        assert_eq!(holders[0].id, "n-1", "still the holder under v1");
        assert_eq!(
            holders[0].address, "127.0.0.1:60000",
            "at its current address"
        );
    }

    /// Six active members in three zones (`n-0`..`n-5` in a, b, c, a, b, c).
    fn six_in_three_zones(replicas: u8) -> Membership {
        use node_config::MemberState::Active;
        let mut doc = topology(
            1,
            &[
                ("n-0", Active),
                ("n-1", Active),
                ("n-2", Active),
                ("n-3", Active),
                ("n-4", Active),
                ("n-5", Active),
            ],
        );
        doc.replicas = replicas;
        for (i, member) in doc.members.iter_mut().enumerate() {
            member.zone = Some(["zone-a", "zone-b", "zone-c"][i % 3].to_owned());
        }
        Membership::new(doc).unwrap()
    }

    fn zone_of<'a>(membership: &'a Membership, id: &str) -> Option<&'a str> {
        membership.ring().member(id).and_then(|m| m.zone())
    }

    #[test]
    fn with_zones_the_second_copy_and_the_next_candidate_are_in_another_zone() {
        let membership = six_in_three_zones(2);
        let keys: Vec<Vec<u8>> = (0..3000).map(|i| format!("Pz{i}").into_bytes()).collect();
        let mut same_zone_successors = 0;
        for key in &keys {
            let owners = membership.owners(key);
            assert_ne!(
                zone_of(&membership, owners[0]),
                zone_of(&membership, owners[1])
            );
            // With two copies the owner's stand-in is the other copy: a write while the
            // owner is away lands where reads look first, in another zone.
            let stand_in = membership.stand_in(key, owners[0]).unwrap();
            assert_eq!(stand_in, owners[1]);
            if zone_of(&membership, membership.ring().ranked(key, 2)[1])
                == zone_of(&membership, owners[0])
            {
                same_zone_successors += 1;
            }
        }
        // A fifth of the keys have a best-ranked successor in the owner's zone: that is
        // where zones move a copy.
        assert!(same_zone_successors > 400, "{same_zone_successors}");

        // With one copy the stand-in is the member that owns the key once the owner is
        // out of the ring: the next one by score, whatever its zone.
        let one = six_in_three_zones(1);
        for key in &keys {
            let owner = one.owners(key)[0];
            assert_eq!(one.stand_in(key, owner), Some(one.ring().ranked(key, 2)[1]));
        }
    }

    #[test]
    fn with_zones_a_node_back_asks_the_holder_its_keys_gained_while_it_was_away() {
        let membership = six_in_three_zones(2);
        for i in 0..500 {
            let key = format!("Pw{i}").into_bytes();
            let owners = membership.owners(&key);
            for (me, other) in [(owners[0], owners[1]), (owners[1], owners[0])] {
                let away = holder_while_away(&membership, Some(me), &key).unwrap();
                let after = membership.owners_without(&key, me);
                // The member the key gains when `me` leaves: never `me`, never the copy
                // it keeps.
                assert!(after.contains(&&away.id));
                assert!(away.id != *me && away.id != *other, "{away:?}");
            }
            let third = ["n-0", "n-1", "n-2", "n-3", "n-4", "n-5"]
                .into_iter()
                .find(|id| !owners.iter().any(|o| o.as_str() == *id))
                .unwrap();
            assert!(holder_while_away(&membership, Some(third), &key).is_none());
        }
    }

    #[test]
    fn a_stopping_owner_sends_writes_to_its_stand_in() {
        let table = RoutingTable::new(Some("n-0".into()), Some(three(1))).unwrap();
        let current = table.current().unwrap();
        let mine = key_owned_by(&current, "n-0");
        let next = table.next_candidate(&mine).unwrap();
        let Route::Forward(peer) = next else {
            panic!("n-0 owns the key: its candidate is a peer");
        };
        // Without zones: the second ring choice, as before zones existed.
        assert_eq!(peer.id, *current.ring().owners(&mine, 2)[1]);
        assert_eq!(current.stand_in(&mine, "n-0"), Some(&peer.id));
    }
}
