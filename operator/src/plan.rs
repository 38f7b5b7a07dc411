//! What a pool needs next: its ring, its StatefulSet size and the node calls of this
//! pass. Pure: a function of the spec, the observed pods, what each node reports and
//! the ring last published, so an operator restarted mid-change picks up where the
//! last one stopped (the state lives in the ring and in the nodes, not in memory).
//!
//! The rules, one pool at a time:
//! - **Ring.** Ordinals below `shards` are members. A new member is `joining` until its
//!   pod is Ready, then `active`; a member that was active stays active while its pod is
//!   briefly not Ready (no ring churn for a crash; replicas = 2 covers it). Ordinals at
//!   or above `shards` that still exist are `draining`. A member restarted with handoff
//!   is `draining` from before its pod stops until it is back Ready on the new template.
//! - **Handoff.** When a member leaves the key space (draining), it first hands its
//!   entries to their next owners (`rebalance` on it); when a member enters it (active),
//!   the others hand it the entries it now owns (`rebalance` on them).
//! - **Restarts** (pod template changed, `OnDelete`): one node at a time, only when every
//!   node is Ready and the ring is settled; highest ordinal first; drained, then evicted
//!   (the PDB is respected). A pool of one node restarts cold: there is no peer.
//! - **Scale-in.** The StatefulSet shrinks only after the leaving nodes are drained and
//!   every node routes by the ring that excludes them.
//! - **Live config.** The new generation is pushed to one node per pass, and only while
//!   every node already running it is Ready.
//! - **Memory** (pod resize, in place): one node at a time in a settled pool. Shrinking:
//!   the node's byte budget is lowered first, then the container limit. Growing: the
//!   limit is raised first, and the budget only once the kubelet reports the new limit
//!   applied. A node is never asked to hold more than its limit allows. Where the
//!   cluster cannot resize (the resize is reported infeasible), the node takes the
//!   restart-with-handoff path instead.
//!
//! Must not import kube's client, tokio or any I/O, nor any module that does (checked by
//! `scripts/check-layers`): it imports `ring`, `build`, `rollout` and `validate`, and
//! reads a node's `stats` answer ([`NodeReport`]) from `crds::admin`.

use std::collections::BTreeMap;

use crds::admin::StatsAnswer;
use crds::node_config::{MemberState, Topology};

use crate::build::PoolLayout;
use crate::ring;
use crate::rollout::Gate;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// How long a joining or returning node's pod must have been Ready before it is
/// published active.
pub const ENTER_AFTER_READY_SECONDS: u64 = 5;

/// How long an active member's pod may stay unready (crashed, its host gone, failing its
/// probe) before it is published `joining`: out of the key space, so its keys route to
/// their next choices and writes succeed there instead of failing. It comes back like a
/// joining node, its keys handed back by the others. Long enough that a kubelet restart
/// of the container (a few seconds) does not move keys twice.
pub const OUT_OF_RING_AFTER_UNREADY_SECONDS: u64 = 10;

/// How long a replacement pod, up behind its readiness gate and running the ring, waits
/// for its peers to hand it its copies before it is admitted without them: a peer that
/// cannot finish a whole rebalance (another node down) must not keep it out for good.
/// Until then the PDB counts it unavailable, so a drain evicts nothing else meanwhile.
pub const ADMIT_WITHOUT_COPIES_AFTER_SECONDS: u64 = 60;

/// What a node runs, as the planner reads it from its `stats` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeReport {
    /// The config generation the node runs.
    pub generation: u64,
    /// The ring version it routes by (0 without a ring).
    pub ring_version: u64,
    /// Entries it holds.
    pub entries: u64,
    /// Its byte budget.
    pub budget_bytes: u64,
    /// Arrow bytes it holds.
    pub used_bytes: u64,
    /// Lookups that found their entry since it started.
    pub hits: u64,
    /// Lookups that found none since it started.
    pub misses: u64,
    /// Milliseconds since it started serving (`None` from older images).
    pub uptime_ms: Option<u64>,
    /// Milliseconds since its last whole rebalance started (`None` before the first).
    pub last_rebalance_ms_ago: Option<u64>,
    /// It holds copies of keys that are not its own, stored since that rebalance.
    pub holds_strays: bool,
    /// Its last whole rebalance left moves or copies unsent.
    pub owes_handover: bool,
    /// Whether it reads ring members' zones (false from images before zones).
    pub reads_zones: bool,
}

impl NodeReport {
    /// It owes its peers a rebalance whatever their ages: it holds strays, or its last
    /// whole rebalance left moves or copies unsent.
    fn owes_whatever_the_ages(&self) -> bool {
        self.holds_strays || self.owes_handover
    }
}

impl From<&StatsAnswer> for NodeReport {
    fn from(stats: &StatsAnswer) -> Self {
        Self {
            generation: stats.generation,
            ring_version: stats.ring_version,
            entries: stats.entries,
            budget_bytes: stats.budget_bytes,
            used_bytes: stats.used_bytes,
            hits: stats.hits,
            misses: stats.misses,
            uptime_ms: stats.uptime_ms,
            last_rebalance_ms_ago: stats.last_rebalance_ms_ago,
            holds_strays: stats.holds_strays,
            owes_handover: stats.owes_handover,
            reads_zones: stats.reads_zones,
        }
    }
}

/// One pod of the pool as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Pod name (the member id).
    pub name: String,
    /// StatefulSet ordinal.
    pub ordinal: i32,
    /// Ready and not terminating.
    pub ready: bool,
    /// Created from the StatefulSet's current revision.
    pub current_template: bool,
    /// Pod IP, once it has one.
    pub ip: Option<String>,
    /// What the node reported this pass (`None`: not asked, or it did not answer).
    pub report: Option<NodeReport>,
    /// Seconds since the pod became Ready (0 when it is not).
    pub ready_seconds: u64,
    /// Seconds since the pod stopped being Ready (0 when it is Ready or never was).
    pub unready_seconds: u64,
    /// The container memory limit in the pod spec (bytes).
    pub memory_limit: Option<u64>,
    /// The memory limit the kubelet reports applied (bytes).
    pub memory_applied: Option<u64>,
    /// Where the pod runs (its Node's zone), as far as known this pass.
    pub zone: ring::PodZone,
    /// The image of its node container.
    pub image: Option<String>,
    /// The Kubernetes node the pod is bound to.
    pub host: Option<String>,
    /// Seconds since the last heartbeat of its Kubernetes node, when that node is lost
    /// (`nodeloss`): its pod may still say Ready, but nothing there answers.
    pub node_lost_seconds: Option<u64>,
    /// The pod's readiness gate, [`crate::build::names::IN_RING_CONDITION`].
    pub gate: Gate,
}

impl NodeView {
    /// The pod IP to call, for a node that answers: Ready, or up behind a closed gate
    /// (it waits for the ring that opens it).
    fn reachable(&self) -> Option<&str> {
        let up_behind_gate = matches!(self.gate, Gate::Closed { up: true });
        if self.ready || up_behind_gate {
            self.ip.as_deref()
        } else {
            None
        }
    }

    /// Ready, and not on a lost node: what the status and metrics count as ready.
    pub fn serving(&self) -> bool {
        self.ready && self.node_lost_seconds.is_none()
    }

    /// The node as the planner sees it: a pod on a lost Kubernetes node is unready since
    /// the node's last heartbeat, whatever its Ready condition still says, so it leaves
    /// the key space on the path of any unready member (after
    /// [`OUT_OF_RING_AFTER_UNREADY_SECONDS`], which a lost node has long passed) and
    /// nobody calls it.
    fn accounting_for_node_loss(&self) -> Self {
        let mut node = self.clone();
        if let Some(lost) = self.node_lost_seconds {
            node.ready = false;
            node.ready_seconds = 0;
            node.unready_seconds = node.unready_seconds.max(lost);
            node.report = None;
            if let Gate::Closed { up } = &mut node.gate {
                *up = false;
            }
        }
        node
    }
}

/// `observed` with the pods on lost Kubernetes nodes counted unready
/// ([`NodeView::accounting_for_node_loss`]); borrowed as is when there are none.
fn accounting_for_node_loss(observed: &PoolObservation) -> std::borrow::Cow<'_, PoolObservation> {
    if observed.nodes.iter().all(|n| n.node_lost_seconds.is_none()) {
        return std::borrow::Cow::Borrowed(observed);
    }
    std::borrow::Cow::Owned(PoolObservation {
        nodes: observed
            .nodes
            .iter()
            .map(NodeView::accounting_for_node_loss)
            .collect(),
        ..observed.clone()
    })
}

/// A pool as observed at the start of a pass.
#[derive(Debug, Clone, Default)]
pub struct PoolObservation {
    /// StatefulSet replicas now (`None`: no StatefulSet yet).
    pub statefulset_replicas: Option<i32>,
    /// Every pod of the pool, any ordinal.
    pub nodes: Vec<NodeView>,
    /// The ring in the pool's ConfigMap (the one last published).
    pub previous: Option<Topology>,
    /// The highest ring version the status recorded.
    pub seen_ring_version: u64,
}

/// A call to one node, or an eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send the ring to these nodes (name, IP).
    PushRing(Vec<(String, String)>),
    /// Ask a node to hand off the entries it does not own (name, IP).
    Rebalance(String, String),
    /// Restart a node through the Eviction API (after its rebalance moved everything).
    Evict(String),
    /// Close the readiness gate of these pods (`False`): their members left the key space
    /// while they could not be reached, so they may hold entries overwritten or
    /// invalidated since; no client call reaches them until they are admitted again.
    HoldOut(Vec<String>),
    /// Open the readiness gate of these pods (`True`): each runs the current ring, so a
    /// node that was held out has dropped what it held.
    Admit(Vec<String>),
    /// Push the live config (the new generation) to a node (name, IP).
    PushConfig(String, String),
    /// Push the live config with the byte budget that fits the pool's memory limit.
    PushBudget(String, String),
    /// Resize a node's memory limit in place.
    Resize(String),
}

/// What is going on in the pool, for status and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Nothing to do.
    Settled,
    /// Waiting for nodes to start or become Ready.
    WaitingForNodes,
    /// New nodes joining; keys move to them.
    ScalingOut(Vec<String>),
    /// Highest nodes draining before the StatefulSet shrinks.
    ScalingIn(Vec<String>),
    /// A node restarting with handoff for a new pod template.
    Restarting(String),
    /// Live config being pushed, one node at a time.
    Configuring,
    /// A node's memory limit and budget changing in place.
    Resizing(String),
}

impl Phase {
    /// Every phase's metric name (the `phase` label of
    /// `flightcache_operator_pool_rollout_phase`).
    pub const NAMES: [&'static str; 7] = [
        "settled",
        "waiting_for_nodes",
        "configuring",
        "resizing",
        "restarting",
        "scaling_out",
        "scaling_in",
    ];

    /// Whether a change of running nodes (config, ring, restarts) is under way.
    pub fn rolling_out(&self) -> bool {
        !matches!(self, Self::Settled | Self::WaitingForNodes)
    }

    /// The phase's name in snake_case, without the nodes it concerns.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::WaitingForNodes => "waiting_for_nodes",
            Self::Configuring => "configuring",
            Self::Resizing(_) => "resizing",
            Self::Restarting(_) => "restarting",
            Self::ScalingOut(_) => "scaling_out",
            Self::ScalingIn(_) => "scaling_in",
        }
    }
}

/// The plan of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    /// Ring and StatefulSet size to apply.
    pub layout: PoolLayout,
    /// Node calls, in order; a failed one ends the pass.
    pub steps: Vec<Step>,
    /// What is going on.
    pub phase: Phase,
}

impl PoolPlan {
    /// Whether the pool is still changing (including nodes still starting).
    pub fn progressing(&self) -> bool {
        self.phase != Phase::Settled
    }
}

/// The plan for `pool` given what was observed: the pass's named steps, in order. Each
/// step is a pure function of the observation and of the steps before it.
pub fn plan_pool(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    observed: &PoolObservation,
) -> PoolPlan {
    let observed = &*accounting_for_node_loss(observed);
    let pass = Pass::new(cluster, pool, observed);

    // The ring: who is a member, in which state, and whether a restart begins.
    let leaving = pass.leaving();
    let mut states = pass.member_states(&leaving);
    let settled = pass.pool_settled(&states, &leaving);
    let cold_restart = if settled {
        start_restart(&pass, &mut states)
    } else {
        None
    };
    let topology = pass.next_ring(&states);
    let ring_changed = pass
        .previous()
        .is_none_or(|p| p.version != topology.version);
    let replicas = pass.statefulset_replicas(&leaving, topology.version, ring_changed);

    // The node calls, in the order they run.
    let mut steps = pass.gate_steps(&states, topology.version);
    steps.extend(pass.ring_push(topology.version));
    steps.extend(pass.handoffs(&leaving, &topology, ring_changed));
    steps.extend(pass.restarts(&states, cold_restart));
    // A replacement waiting at its gate for its copies leaves the ring quiet: its peers
    // are asked for them while it waits.
    let settled_but_for_copies = settled
        || (pass.pool_settled_once_ready(&states, &leaving)
            && pass.ready_but_for_copies(&states, topology.version));
    let quiet_ring = settled_but_for_copies && !ring_changed && cold_restart.is_none();
    if quiet_ring && pass.all_route_by(topology.version) && !has_rollout_steps(&steps) {
        steps.extend(pass.handovers_owed());
    }
    steps.extend(pass.config_push());
    let quiet = settled && cold_restart.is_none() && all_active(&states);
    let resizing = if quiet { pass.next_resize() } else { None };
    if let Some((_, Some(step))) = &resizing {
        steps.push(step.clone());
    }

    let phase = pass.phase(&PhaseInputs {
        states: &states,
        leaving: &leaving,
        cold_restart,
        resizing: resizing.map(|(ordinal, _)| ordinal),
        steps: &steps,
    });
    PoolPlan {
        layout: PoolLayout { topology, replicas },
        steps,
        phase,
    }
}

/// Every member of `states` is active.
fn all_active(states: &BTreeMap<i32, MemberState>) -> bool {
    states.values().all(|s| *s == MemberState::Active)
}

/// Whether `steps` already move keys or restart a node (a rollout is under way).
fn has_rollout_steps(steps: &[Step]) -> bool {
    steps
        .iter()
        .any(|s| matches!(s, Step::Rebalance(..) | Step::Evict(..)))
}

/// A restart with handoff for a new pod template, in a settled pool: the highest
/// outdated member starts draining, or, in a pool of one node (no peer to hand off to),
/// the ordinal to restart cold is returned.
fn start_restart(pass: &Pass<'_>, states: &mut BTreeMap<i32, MemberState>) -> Option<i32> {
    let outdated = (0..pass.pool.shards)
        .rev()
        .find(|&o| !pass.current_template(o))?;
    if pass.pool.shards > 1 {
        states.insert(outdated, MemberState::Draining);
        None
    } else {
        Some(outdated)
    }
}

/// What the pool's phase is read from, once the pass's steps are planned.
struct PhaseInputs<'p> {
    states: &'p BTreeMap<i32, MemberState>,
    leaving: &'p [i32],
    cold_restart: Option<i32>,
    resizing: Option<i32>,
    steps: &'p [Step],
}

/// One pass over one pool: the observation indexed by ordinal, and the questions the
/// steps ask of it.
struct Pass<'a> {
    cluster: &'a ValidatedCluster,
    pool: &'a ValidatedPool,
    observed: &'a PoolObservation,
    by_ordinal: BTreeMap<i32, &'a NodeView>,
}

impl<'a> Pass<'a> {
    fn new(
        cluster: &'a ValidatedCluster,
        pool: &'a ValidatedPool,
        observed: &'a PoolObservation,
    ) -> Self {
        let by_ordinal = observed.nodes.iter().map(|n| (n.ordinal, n)).collect();
        Self {
            cluster,
            pool,
            observed,
            by_ordinal,
        }
    }

    /// The ring last published.
    fn previous(&self) -> Option<&'a Topology> {
        self.observed.previous.as_ref()
    }

    /// The state `ordinal` had in the ring last published.
    fn previous_state(&self, ordinal: i32) -> Option<MemberState> {
        self.previous()
            .and_then(|p| ring::state_of(p, self.cluster, self.pool, ordinal))
    }

    fn node(&self, ordinal: i32) -> Option<&'a NodeView> {
        self.by_ordinal.get(&ordinal).copied()
    }

    fn ready(&self, ordinal: i32) -> bool {
        self.node(ordinal).is_some_and(|n| n.ready)
    }

    /// Ready for at least [`ENTER_AFTER_READY_SECONDS`].
    fn ready_long_enough(&self, ordinal: i32) -> bool {
        self.node(ordinal)
            .is_some_and(|n| n.ready && n.ready_seconds >= ENTER_AFTER_READY_SECONDS)
    }

    fn current_template(&self, ordinal: i32) -> bool {
        self.node(ordinal).is_some_and(|n| n.current_template)
    }

    /// Unready for at least [`OUT_OF_RING_AFTER_UNREADY_SECONDS`].
    fn out_too_long(&self, ordinal: i32) -> bool {
        self.node(ordinal)
            .is_some_and(|n| !n.ready && n.unready_seconds >= OUT_OF_RING_AFTER_UNREADY_SECONDS)
    }

    /// Not Ready, yet it answers: its containers are ready and it reported this pass.
    /// Either up behind its closed readiness gate, or just admitted (the gate open, the
    /// kubelet yet to mark the pod Ready: a CI run's force-deleted replacement was read
    /// as unready since its creation in that half second and taken out of the ring).
    fn answering_while_unready(&self, ordinal: i32) -> bool {
        self.node(ordinal).is_some_and(|n| {
            n.report.is_some() && matches!(n.gate, Gate::Closed { up: true } | Gate::Open)
        })
    }

    /// Another member is active and Ready to take `ordinal`'s keys (a pool never
    /// publishes a ring without an owner).
    fn others_serve(&self, ordinal: i32) -> bool {
        (0..self.pool.shards).any(|o| {
            o != ordinal && self.ready(o) && self.previous_state(o) == Some(MemberState::Active)
        })
    }

    fn all_ready(&self) -> bool {
        (0..self.pool.shards).all(|o| self.ready(o))
    }

    /// Every reachable node routes by ring `version` or a later one.
    fn all_route_by(&self, version: u64) -> bool {
        self.observed
            .nodes
            .iter()
            .filter(|n| n.reachable().is_some())
            .all(|n| runs_ring(n, version))
    }

    /// The ordinals leaving the pool: at or above `shards`, in the StatefulSet or still
    /// running.
    fn leaving(&self) -> Vec<i32> {
        let shards = self.pool.shards;
        let current = self.observed.statefulset_replicas.unwrap_or(shards);
        (shards..current.max(shards))
            .chain(self.by_ordinal.keys().copied().filter(|&o| o >= shards))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Each ordinal's state in the next ring; `leaving` ones are draining.
    fn member_states(&self, leaving: &[i32]) -> BTreeMap<i32, MemberState> {
        let mut states: BTreeMap<i32, MemberState> = (0..self.pool.shards)
            .map(|ordinal| (ordinal, self.member_state(ordinal)))
            .collect();
        for &ordinal in leaving {
            states.insert(ordinal, MemberState::Draining);
        }
        states
    }

    /// The next state of member `ordinal` (below `shards`).
    fn member_state(&self, ordinal: i32) -> MemberState {
        let previous = self.previous().is_some();
        match (previous, self.previous_state(ordinal), self.ready(ordinal)) {
            // A new pool starts with every node active: nothing to hand off yet.
            (false, _, _) => MemberState::Active,
            // Up behind its closed gate and answering: a new pod not yet admitted (a
            // replacement waits there for its copies, `waiting_for_copies`), or admitted a
            // moment ago. Its Ready condition has been False since it was created, which
            // is not a member gone.
            (true, Some(MemberState::Active), false) if self.answering_while_unready(ordinal) => {
                MemberState::Active
            }
            // Unready too long while another member can take its keys: out of the key
            // space, back like a joining node.
            (true, Some(MemberState::Active), false)
                if self.out_too_long(ordinal) && self.others_serve(ordinal) =>
            {
                MemberState::Joining
            }
            (true, Some(MemberState::Active), _) => MemberState::Active,
            (true, Some(MemberState::Draining), true) if !self.current_template(ordinal) => {
                MemberState::Draining
            }
            // A node enters the key space only once its pod has been Ready for a moment,
            // so its stable DNS name resolves on every peer (the headless Service's
            // EndpointSlice and DNS caches lag the pod by a few seconds).
            (true, _, true) if self.ready_long_enough(ordinal) => MemberState::Active,
            (true, Some(MemberState::Draining), _) => MemberState::Draining,
            (true, _, _) => MemberState::Joining,
        }
    }

    /// Whether a restart with handoff may start: every node Ready, nobody joining or
    /// leaving, no other handoff running, and the ring published last was already all
    /// active (so a returning node gets its keys back before the next one leaves).
    fn pool_settled(&self, states: &BTreeMap<i32, MemberState>, leaving: &[i32]) -> bool {
        self.all_ready() && self.pool_settled_once_ready(states, leaving)
    }

    /// [`Pass::pool_settled`] but for its nodes' readiness.
    fn pool_settled_once_ready(
        &self,
        states: &BTreeMap<i32, MemberState>,
        leaving: &[i32],
    ) -> bool {
        let ring_was_settled = self.previous().is_none_or(|p| {
            p.members.iter().all(|m| m.state == MemberState::Active)
                && p.members.len() == states.len()
        });
        leaving.is_empty() && ring_was_settled && all_active(states)
    }

    /// The ring to publish for `states`, zones as far as this pass knows them.
    fn next_ring(&self, states: &BTreeMap<i32, MemberState>) -> Topology {
        let sightings: Vec<ring::ZoneSighting<'_>> = self
            .observed
            .nodes
            .iter()
            .map(|node| ring::ZoneSighting {
                ordinal: node.ordinal,
                zone: &node.zone,
                image: node.image.as_deref(),
                reads_zones: node.report.map(|report| report.reads_zones),
            })
            .collect();
        let previous = self.previous();
        let zones = ring::compute_zones(self.cluster, self.pool, states, &sightings, previous);
        ring::plan_topology(
            self.cluster,
            self.pool,
            states,
            &zones,
            previous,
            self.observed.seen_ring_version,
        )
    }

    /// The StatefulSet's size: it shrinks only once the leaving nodes are drained (or
    /// cannot be asked) and every reachable node routes by the ring without them.
    fn statefulset_replicas(&self, leaving: &[i32], version: u64, ring_changed: bool) -> i32 {
        let shards = self.pool.shards;
        let leaving_drained = leaving.iter().all(|&o| match self.node(o) {
            Some(node) if node.ready => node.report.is_some_and(|r| r.entries == 0),
            _ => true,
        });
        if leaving.is_empty() || (!ring_changed && self.all_route_by(version) && leaving_drained) {
            shards
        } else {
            self.observed
                .statefulset_replicas
                .unwrap_or(shards)
                .max(shards)
        }
    }

    /// Readiness gates, first: holding a node out must not wait for a node call that may
    /// fail. A joining member whose pod is not Ready, and that runs no ring that says it
    /// is joining (it could not be reached to be told it is out), is held out; a node held
    /// out is admitted once it runs ring `version` and, when it owns keys, once its peers
    /// have handed it its copies ([`Pass::waiting_for_copies`]).
    fn gate_steps(&self, states: &BTreeMap<i32, MemberState>, version: u64) -> Vec<Step> {
        // Not one it has just admitted: that one runs the ring (admitting asks it), and its
        // pod turns Ready only once the kubelet has seen the gate open — a pass in between
        // closed it again, and a scaled-out pod went back and forth for a minute (a CI run
        // of the operator e2e). Nor one that runs the ring last published while joining in
        // it: it has dropped what it held, so a new ring (a peer of the same scale-out
        // turning active) is no reason to close its gate (a CI run's scale-out held one of
        // two new pods out as the other entered).
        let knows_it_is_joining = |n: &NodeView| {
            runs_ring(n, version)
                || (self.previous_state(n.ordinal) == Some(MemberState::Joining)
                    && self.previous().is_some_and(|p| runs_ring(n, p.version)))
        };
        let held_out = self.names_of(|n| {
            n.gate == Gate::Open
                && !n.ready
                && states.get(&n.ordinal) == Some(&MemberState::Joining)
                && !knows_it_is_joining(n)
        });
        let admitted = self.names_of(|n| {
            n.gate == (Gate::Closed { up: true })
                && runs_ring(n, version)
                && !self.waiting_for_copies(n, states, version)
        });
        [
            (!held_out.is_empty()).then_some(Step::HoldOut(held_out)),
            (!admitted.is_empty()).then_some(Step::Admit(admitted)),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// `node` is up behind its gate, runs ring `version`, owns keys in it, and a peer
    /// still owes it a handover ([`owes_a_handover`]): a replacement pod (a drain's
    /// eviction, a deleted pod) starts empty in an unchanged ring, and until its peers
    /// have sent it its copies, admitting it would let the PDB evict the next pod while
    /// this one's keys have a single copy (a drain of a node with two pods of the pool
    /// lost 2,658 and 3,740 keys, budget 102). Not past
    /// [`ADMIT_WITHOUT_COPIES_AFTER_SECONDS`] of its uptime.
    fn waiting_for_copies(
        &self,
        node: &NodeView,
        states: &BTreeMap<i32, MemberState>,
        version: u64,
    ) -> bool {
        let Some(uptime_ms) = node.report.and_then(|r| r.uptime_ms) else {
            return false;
        };
        node.gate == (Gate::Closed { up: true })
            && runs_ring(node, version)
            && states.get(&node.ordinal) == Some(&MemberState::Active)
            && uptime_ms < ADMIT_WITHOUT_COPIES_AFTER_SECONDS * 1000
            && self
                .observed
                .nodes
                .iter()
                .filter(|peer| peer.ordinal != node.ordinal && peer.reachable().is_some())
                .any(|peer| owes_a_handover(peer, uptime_ms))
    }

    /// Every member Ready, or waiting at its gate for its copies
    /// ([`Pass::waiting_for_copies`]).
    fn ready_but_for_copies(&self, states: &BTreeMap<i32, MemberState>, version: u64) -> bool {
        (0..self.pool.shards).all(|o| {
            self.ready(o)
                || self
                    .node(o)
                    .is_some_and(|n| self.waiting_for_copies(n, states, version))
        })
    }

    fn names_of(&self, wanted: impl Fn(&NodeView) -> bool) -> Vec<String> {
        self.observed
            .nodes
            .iter()
            .filter(|n| wanted(n))
            .map(|n| n.name.clone())
            .collect()
    }

    /// Ring `version` pushed to every reachable node behind it.
    fn ring_push(&self, version: u64) -> Option<Step> {
        let behind: Vec<(String, String)> = self
            .observed
            .nodes
            .iter()
            .filter(|n| !runs_ring(n, version))
            .filter_map(|n| Some((n.name.clone(), n.reachable()?.to_owned())))
            .collect();
        (!behind.is_empty()).then_some(Step::PushRing(behind))
    }

    /// The rebalances a changed ring asks for: entering members get their keys from the
    /// others; a new number of copies (or second copies moved between zones) has every
    /// node move its copies; leaving nodes with entries hand them off.
    fn handoffs(&self, leaving: &[i32], topology: &Topology, ring_changed: bool) -> Vec<Step> {
        // One definition with the nodes' (`Topology::asks_handoff_of`): a node that installs
        // the ring says it owes a handover until it has rebalanced on it.
        let previous = self.previous();
        let entering: Vec<&str> = previous
            .map(|p| topology.entering_since(p))
            .unwrap_or_default();
        // A new number of copies per key moves no key's first choice, so nobody enters.
        // A member in another zone is the same with two copies (zones move second copies
        // only, never a key's owner).
        let copies_changed = previous.is_some_and(|p| topology.copies_moved_since(p));
        let mut giving: Vec<&NodeView> = Vec::new();
        if ring_changed && !entering.is_empty() {
            giving.extend(
                self.observed
                    .nodes
                    .iter()
                    .filter(|n| !entering.contains(&n.name.as_str())),
            );
        }
        if ring_changed && copies_changed && entering.is_empty() {
            giving.extend(&self.observed.nodes);
        }
        giving.extend(
            leaving
                .iter()
                .filter_map(|&o| self.node(o))
                .filter(|node| node.report.is_none_or(|r| r.entries > 0)),
        );
        giving.into_iter().filter_map(rebalance).collect()
    }

    /// A draining member on an old template hands off, then restarts; a pool of one
    /// restarts its node cold.
    fn restarts(
        &self,
        states: &BTreeMap<i32, MemberState>,
        cold_restart: Option<i32>,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        let restarting = (0..self.pool.shards).find(|&o| {
            states.get(&o) == Some(&MemberState::Draining)
                && self.ready(o)
                && !self.current_template(o)
        });
        if let Some(node) = restarting.and_then(|o| self.node(o)) {
            steps.extend(rebalance(node));
            steps.push(Step::Evict(node.name.clone()));
        }
        if let Some(node) = cold_restart.and_then(|o| self.node(o)) {
            steps.push(Step::Evict(node.name.clone()));
        }
        steps
    }

    /// A node that restarted outside a rollout (a deleted or force-killed pod, a crash)
    /// comes back into an unchanged ring, empty or with only its disk tier: nobody
    /// enters, so no handoff sends it its keys, and with two copies nothing refills its
    /// second copies (read repair refills first copies only). Each node whose last whole
    /// rebalance began before such a peer started serving owes it what it lacks, and
    /// rebalances once; so does a node holding strays ([`owing_a_handover`]).
    fn handovers_owed(&self) -> Vec<Step> {
        owing_a_handover(&self.observed.nodes)
            .into_iter()
            .filter_map(rebalance)
            .collect()
    }

    /// Live config: the new generation to one node per pass, while every node already on
    /// it is healthy.
    fn config_push(&self) -> Option<Step> {
        let target = self.config_target();
        let at_target_healthy = self
            .observed
            .nodes
            .iter()
            .filter(|n| n.report.is_some_and(|r| r.generation >= target))
            .all(|n| n.ready);
        if !at_target_healthy {
            return None;
        }
        let node = self
            .observed
            .nodes
            .iter()
            .filter(|n| n.ordinal < self.pool.shards && n.reachable().is_some())
            .find(|n| n.report.is_some_and(|r| r.generation < target))?;
        Some(Step::PushConfig(
            node.name.clone(),
            node.reachable()?.to_owned(),
        ))
    }

    /// The live config generation every member should run.
    fn config_target(&self) -> u64 {
        u64::try_from(self.cluster.generation).unwrap_or(0)
    }

    /// A member runs an older config, or has not said which.
    fn config_behind(&self) -> bool {
        let target = self.config_target();
        self.observed
            .nodes
            .iter()
            .any(|n| n.ordinal < self.pool.shards && n.report.is_none_or(|r| r.generation < target))
    }

    /// Memory, in place, one node at a time: the first member whose memory is not done,
    /// with its next step (`None` while waiting).
    fn next_resize(&self) -> Option<(i32, Option<Step>)> {
        self.observed
            .nodes
            .iter()
            .filter(|n| n.ordinal < self.pool.shards)
            .find_map(|node| Some((node.ordinal, plan_resize(self.pool, node)?)))
    }

    /// What is going on in the pool, the most disruptive first.
    fn phase(&self, inputs: &PhaseInputs<'_>) -> Phase {
        let name = |o: &i32| ring::member_id(self.cluster, self.pool, *o);
        let shards = self.pool.shards;
        // A joining member whose pod has been unready a while (a node out of the ring, or
        // a new pod that cannot start) is waiting for its node, not scaling out.
        let joining: Vec<String> = inputs
            .states
            .iter()
            .filter(|&(&o, &s)| s == MemberState::Joining && !self.out_too_long(o))
            .map(|(o, _)| name(o))
            .collect();
        let draining = (0..shards).find(|o| inputs.states.get(o) == Some(&MemberState::Draining));
        let missing = self.observed.nodes.len() < usize::try_from(shards).unwrap_or(0);
        if !inputs.leaving.is_empty() {
            Phase::ScalingIn(inputs.leaving.iter().map(name).collect())
        } else if !joining.is_empty() {
            Phase::ScalingOut(joining)
        } else if let Some(ordinal) = draining.or(inputs.cold_restart) {
            Phase::Restarting(name(&ordinal))
        } else if let Some(ordinal) = inputs.resizing {
            Phase::Resizing(name(&ordinal))
        } else if !self.all_ready() || missing {
            Phase::WaitingForNodes
        } else if self.config_behind()
            || !inputs.steps.is_empty()
            || (0..shards).any(|o| !self.current_template(o))
        {
            Phase::Configuring
        } else {
            Phase::Settled
        }
    }
}

/// `node` reports running ring `version` or a later one.
fn runs_ring(node: &NodeView, version: u64) -> bool {
    node.report.is_some_and(|r| r.ring_version >= version)
}

/// A rebalance of `node`, when it can be called.
fn rebalance(node: &NodeView) -> Option<Step> {
    let ip = node.reachable()?;
    Some(Step::Rebalance(node.name.clone(), ip.to_owned()))
}

/// The nodes that owe a peer a handover: the ones that say they hold copies of keys that
/// are not theirs (`holdsStrays`: a replaced pod's old process handed them its entries
/// by the ring it last had), and those that owe a restarted peer its copies, i.e. Ready
/// nodes whose last whole rebalance (before the first, their own start) began before
/// another Ready node started serving. Times are the nodes' own (`uptimeMs`,
/// `lastRebalanceMsAgo`, read in the same pass), so no clocks are compared. A node that
/// does not report them (an older image) neither owes nor is owed.
///
/// Strays are asked for on their own: an older node reports them only as "no whole
/// rebalance", which the age rule reads as "since it started", so the pool's youngest
/// node kept the strays an old process handed it (a CI run's node-hung: 392 keys with a
/// third copy for good).
///
/// So is a node whose last whole rebalance left moves or copies unsent, or that installed
/// a ring asking it to hand off and has not rebalanced on it yet (`owesHandover`): a
/// handoff that failed, or was never called, is asked for on the next quiet pass. The
/// ring change that asked for it is published by then, and a peer cut off and back has
/// not restarted, so neither rule above would ever ask again.
///
/// A node up behind its closed gate counts as started: its peers owe it its copies
/// before it is admitted ([`Pass::waiting_for_copies`]).
fn owing_a_handover(nodes: &[NodeView]) -> Vec<&NodeView> {
    let started: Vec<(i32, u64)> = nodes
        .iter()
        .filter(|n| n.ready || n.gate == (Gate::Closed { up: true }))
        .filter_map(|n| Some((n.ordinal, n.report?.uptime_ms?)))
        .collect();
    nodes
        .iter()
        .filter(|owing| owing.reachable().is_some())
        .filter(|owing| {
            owing.report.is_some_and(|r| r.owes_whatever_the_ages())
                || started.iter().any(|&(ordinal, uptime)| {
                    ordinal != owing.ordinal && owes_a_handover(owing, uptime)
                })
        })
        .collect()
}

/// `owing` holds strays or left sends of its last whole rebalance undone, or that
/// rebalance (before the first, its own start) began before a peer that has been serving for `peer_uptime_ms` started. A node that
/// does not report its times (an older image) owes nothing.
fn owes_a_handover(owing: &NodeView, peer_uptime_ms: u64) -> bool {
    let Some(report) = owing.report else {
        return false;
    };
    if report.owes_whatever_the_ages() {
        return true;
    }
    report
        .last_rebalance_ms_ago
        .or(report.uptime_ms)
        .is_some_and(|since| peer_uptime_ms < since)
}

/// The next resize step of `node`: `None` when its memory is done, `Some(None)` while
/// waiting (for the kubelet to apply a limit, or for the node to report).
fn plan_resize(pool: &ValidatedPool, node: &NodeView) -> Option<Option<Step>> {
    let limit = node.memory_limit?;
    let wanted = pool.memory_limit_bytes;
    let budget = node.report.map(|r| r.budget_bytes);
    let ip = node.reachable()?;
    let push_budget = || Step::PushBudget(node.name.clone(), ip.to_owned());
    if limit > wanted {
        // Shrink: the budget comes down before the limit.
        return Some(match budget {
            Some(b) if b > pool.budget_bytes => Some(push_budget()),
            Some(_) => Some(Step::Resize(node.name.clone())),
            None => None,
        });
    }
    if limit < wanted {
        return Some(Some(Step::Resize(node.name.clone())));
    }
    if node.memory_applied.is_some_and(|applied| applied != wanted) {
        return Some(None);
    }
    match budget {
        Some(b) if b != pool.budget_bytes => Some(Some(push_budget())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    fn node(ordinal: i32, ready: bool, current: bool, report: Option<NodeReport>) -> NodeView {
        NodeView {
            name: format!("demo-hot-{ordinal}"),
            ordinal,
            ready,
            current_template: current,
            ip: Some(format!("10.0.0.{ordinal}")),
            report,
            ready_seconds: if ready { 60 } else { 0 },
            unready_seconds: 0,
            memory_limit: Some(512 << 20),
            memory_applied: Some(512 << 20),
            zone: ring::PodZone::Unknown,
            image: Some("flightcache/node:test".into()),
            host: Some(format!("worker-{ordinal}")),
            node_lost_seconds: None,
            gate: Gate::Ungated,
        }
    }

    fn report(generation: u64, ring_version: u64, entries: u64) -> Option<NodeReport> {
        Some(NodeReport {
            generation,
            ring_version,
            entries,
            budget_bytes: validated(&[("hot", 1)]).pools[0].budget_bytes,
            uptime_ms: None,
            last_rebalance_ms_ago: None,
            holds_strays: false,
            reads_zones: true,
            ..NodeReport::default()
        })
    }

    fn settled_ring(cluster: &ValidatedCluster, shards: i32) -> Topology {
        ring::plan_topology(
            cluster,
            &cluster.pools[0],
            &ring::all_active(shards),
            &ring::no_zones(),
            None,
            0,
        )
    }

    /// A ring of three members, all active but `ordinal` in `state`.
    fn ring_with(cluster: &ValidatedCluster, ordinal: i32, state: MemberState) -> Topology {
        let mut states = ring::all_active(3);
        states.insert(ordinal, state);
        ring::plan_topology(
            cluster,
            &cluster.pools[0],
            &states,
            &ring::no_zones(),
            None,
            0,
        )
    }

    #[test]
    fn every_phase_has_one_distinct_metric_name() {
        let phases = [
            Phase::Settled,
            Phase::WaitingForNodes,
            Phase::Configuring,
            Phase::Resizing("p-1".into()),
            Phase::Restarting("p-1".into()),
            Phase::ScalingOut(vec!["p-3".into()]),
            Phase::ScalingIn(vec!["p-2".into()]),
        ];
        let names: Vec<&str> = phases.iter().map(Phase::as_str).collect();
        assert_eq!(names, Phase::NAMES);
    }

    #[test]
    fn a_new_pool_starts_with_every_node_active_and_no_calls() {
        let cluster = validated(&[("hot", 3)]);
        let plan = plan_pool(&cluster, &cluster.pools[0], &PoolObservation::default());
        assert_eq!(
            plan.layout,
            PoolLayout::initial(&cluster, &cluster.pools[0])
        );
        assert!(plan.steps.is_empty());
        assert_eq!(plan.phase, Phase::WaitingForNodes);
    }

    #[test]
    fn a_settled_pool_does_nothing() {
        let cluster = validated(&[("hot", 3)]);
        let ring = settled_ring(&cluster, 3);
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 10)))
                .collect(),
            previous: Some(ring.clone()),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(plan.layout.topology, ring);
        assert_eq!(plan.layout.replicas, 3);
        assert_eq!(plan.steps, []);
        assert_eq!(plan.phase, Phase::Settled);
    }

    /// A settled pool where each node reports when it started and when its last whole
    /// rebalance began (milliseconds ago; `None`: never).
    fn timed_pool(times: [(u64, Option<u64>); 3]) -> (ValidatedCluster, PoolObservation) {
        let cluster = validated(&[("hot", 3)]);
        let ring = settled_ring(&cluster, 3);
        let nodes = (0..3)
            .map(|o| {
                let (uptime, rebalanced) = times[o as usize];
                let timed = report(3, 1, 10).map(|r| NodeReport {
                    uptime_ms: Some(uptime),
                    last_rebalance_ms_ago: rebalanced,
                    ..r
                });
                node(o, true, true, timed)
            })
            .collect();
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes,
            previous: Some(ring),
            seen_ring_version: 1,
        };
        (cluster, observed)
    }

    #[test]
    fn the_peers_of_a_node_that_restarted_in_an_unchanged_ring_send_it_its_copies() {
        // demo-hot-1 was force-deleted and is back (up 20 s); the others last rebalanced
        // an hour ago, before it started: both owe it its keys.
        let (cluster, observed) = timed_pool([
            (7_200_000, Some(3_600_000)),
            (20_000, None),
            (7_200_000, None),
        ]);
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(plan.layout.topology, observed.previous.clone().unwrap());
        assert_eq!(
            plan.steps,
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into()),
            ]
        );
        assert_eq!(plan.phase, Phase::Configuring);

        // Once they have rebalanced (after it started), nothing more: the pool settles.
        let (cluster, observed) = timed_pool([
            (7_200_000, Some(5_000)),
            (20_000, None),
            (7_200_000, Some(4_000)),
        ]);
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(plan.steps, []);
        assert_eq!(plan.phase, Phase::Settled);
    }

    #[test]
    fn a_replacement_waits_at_its_gate_until_its_peers_have_handed_it_its_copies() {
        // A drain evicted demo-hot-1; its replacement is up behind its gate (up 5 s), runs
        // the ring, and is empty: its peers last rebalanced long before it started.
        let (cluster, mut observed) = timed_pool([
            (7_200_000, Some(3_600_000)),
            (5_000, None),
            (7_200_000, None),
        ]);
        observed.nodes[1].ready = false;
        observed.nodes[1].gate = Gate::Closed { up: true };
        let waiting = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            waiting.steps,
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into()),
            ],
            "not admitted; its peers are asked for its copies while it waits"
        );
        assert_eq!(waiting.phase, Phase::WaitingForNodes);
        // Its Ready condition has been False since it was created: waiting past the
        // out-of-ring grace does not take it out of the key space.
        observed.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS * 3;
        let still = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(still.layout.topology, observed.previous.clone().unwrap());
        assert_eq!(still.steps, waiting.steps);

        // One peer has rebalanced since it started, the other has not: still waiting.
        observed.nodes[0].report = observed.nodes[0].report.map(|r| NodeReport {
            last_rebalance_ms_ago: Some(2_000),
            ..r
        });
        let half = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            half.steps,
            [Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into())]
        );

        // Both have: admitted.
        observed.nodes[2].report = observed.nodes[2].report.map(|r| NodeReport {
            last_rebalance_ms_ago: Some(1_000),
            ..r
        });
        let whole = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(whole.steps, [Step::Admit(vec!["demo-hot-1".into()])]);

        // Admitted: its gate is open, and until the kubelet marks the pod Ready it is
        // still unready since its creation. It answers, so it stays in the key space.
        let mut admitted = observed.clone();
        admitted.nodes[1].gate = Gate::Open;
        let lag = plan_pool(&cluster, &cluster.pools[0], &admitted);
        assert_eq!(lag.layout.topology, observed.previous.clone().unwrap());
        assert!(
            !lag.steps.iter().any(|s| matches!(s, Step::HoldOut(_))),
            "{:?}",
            lag.steps
        );
        // The same pod silent (its report missing) is a member gone: out of the key space.
        admitted.nodes[1].report = None;
        let gone = plan_pool(&cluster, &cluster.pools[0], &admitted);
        assert_eq!(
            ring::state_of(&gone.layout.topology, &cluster, &cluster.pools[0], 1),
            Some(MemberState::Joining)
        );

        // A peer still holding strays (the evicted process's exit handoff) owes them first.
        let mut strays = observed.clone();
        strays.nodes[2].report = strays.nodes[2].report.map(|r| NodeReport {
            holds_strays: true,
            ..r
        });
        let plan = plan_pool(&cluster, &cluster.pools[0], &strays);
        assert_eq!(
            plan.steps,
            [Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into())]
        );

        // A peer that never finishes a whole rebalance keeps it out for the bound only.
        let mut stuck = strays;
        stuck.nodes[1].report = stuck.nodes[1].report.map(|r| NodeReport {
            uptime_ms: Some(ADMIT_WITHOUT_COPIES_AFTER_SECONDS * 1000),
            ..r
        });
        let plan = plan_pool(&cluster, &cluster.pools[0], &stuck);
        assert!(
            plan.steps.contains(&Step::Admit(vec!["demo-hot-1".into()])),
            "{:?}",
            plan.steps
        );

        // A joining member owns no keys yet: admitted once it runs the ring, as before.
        let mut joining = observed.clone();
        joining.nodes[0].report = joining.nodes[0].report.map(|r| NodeReport {
            last_rebalance_ms_ago: Some(3_600_000),
            ..r
        });
        joining.previous = Some(ring_with(&cluster, 1, MemberState::Joining));
        let plan = plan_pool(&cluster, &cluster.pools[0], &joining);
        assert!(
            plan.steps.contains(&Step::Admit(vec!["demo-hot-1".into()])),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn the_youngest_node_holding_strays_is_asked_to_rebalance() {
        // A CI run's node-hung: demo-hot-1 and demo-hot-2 ran again elsewhere; once the
        // hung node thawed, their old processes handed their entries off by their old
        // ring. demo-hot-0 (old) was asked again; demo-hot-2 (the youngest) never was, as
        // no peer started after it, and kept its third copies.
        let (cluster, mut observed) = timed_pool([
            (7_200_000, Some(20_000)),
            (60_000, Some(30_000)),
            (59_000, None),
        ]);
        let strays = |observed: &PoolObservation| {
            plan_pool(&cluster, &cluster.pools[0], observed)
                .steps
                .into_iter()
                .filter(|s| matches!(s, Step::Rebalance(..)))
                .collect::<Vec<_>>()
        };
        assert_eq!(strays(&observed), [], "without strays nobody owes anything");
        if let Some(report) = observed.nodes[2].report.as_mut() {
            report.holds_strays = true;
        }
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            plan.steps,
            [Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into())]
        );
        assert_eq!(plan.phase, Phase::Configuring, "requeued soon, not idle");
        // Not while the ring changes: that pass rebalances whom the change asks.
        observed.nodes[0].report = observed.nodes[0].report.map(|r| NodeReport {
            ring_version: 0,
            ..r
        });
        assert!(
            !plan_pool(&cluster, &cluster.pools[0], &observed)
                .steps
                .contains(&Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into())),
            "a node not on the ring yet comes first"
        );
    }

    #[test]
    fn a_node_whose_last_rebalance_left_sends_undone_is_asked_again() {
        // A CI run's node-partition: demo-hot-1 was cut off, left the key space and came
        // back into it without a restart. demo-hot-0's handoff to it failed; the ring
        // change that asked for it was published, and every node had served for hours,
        // so no rule asked demo-hot-0 again and a fifth of the keys kept one copy.
        let (cluster, mut observed) = timed_pool([
            (7_200_000, Some(20_000)),
            (7_100_000, Some(30_000)),
            (7_000_000, Some(25_000)),
        ]);
        let rebalances = |observed: &PoolObservation| {
            plan_pool(&cluster, &cluster.pools[0], observed)
                .steps
                .into_iter()
                .filter(|s| matches!(s, Step::Rebalance(..)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            rebalances(&observed),
            [],
            "old peers and whole rebalances: none"
        );
        if let Some(report) = observed.nodes[0].report.as_mut() {
            report.owes_handover = true;
        }
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            plan.steps,
            [Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into())]
        );
        assert_eq!(
            plan.phase,
            Phase::Configuring,
            "asked again soon, not at the idle resync"
        );
    }

    #[test]
    fn nodes_that_started_together_owe_only_the_ones_started_after_them_and_old_images_nothing() {
        // A new pool: each node owes the ones that started after it, once (empty stores).
        let (cluster, observed) = timed_pool([(9_000, None), (8_000, None), (7_000, None)]);
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            plan.steps,
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-1".into(), "10.0.0.1".into()),
            ]
        );
        // A node that does not report its times neither owes nor is owed.
        let (cluster, mut observed) = timed_pool([
            (7_200_000, Some(3_600_000)),
            (20_000, None),
            (7_200_000, None),
        ]);
        for n in &mut observed.nodes {
            n.report = report(3, 1, 10);
        }
        assert_eq!(plan_pool(&cluster, &cluster.pools[0], &observed).steps, []);
        // An unready peer is not owed yet (it may still be loading its disk tier).
        let (cluster, mut observed) = timed_pool([
            (7_200_000, Some(3_600_000)),
            (20_000, None),
            (7_200_000, None),
        ]);
        observed.nodes[1].ready = false;
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Rebalance(..))),
            "{:?}",
            plan.steps
        );
    }
    #[test]
    fn a_second_copy_per_key_has_every_node_fill_the_copies_it_owes() {
        let one_copy = validated(&[("hot", 3)]);
        let mut two_copies = one_copy.clone();
        two_copies.pools[0].replicas = 2;
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&one_copy, 3)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&two_copies, &two_copies.pools[0], &observed);
        assert_eq!(plan.layout.topology.replicas, 2);
        assert_eq!(plan.layout.topology.version, 2);
        let nodes: Vec<(String, String)> = (0..3)
            .map(|o| (format!("demo-hot-{o}"), format!("10.0.0.{o}")))
            .collect();
        let mut expected = vec![Step::PushRing(nodes.clone())];
        expected.extend(
            nodes
                .into_iter()
                .map(|(name, ip)| Step::Rebalance(name, ip)),
        );
        assert_eq!(plan.steps, expected);

        // Back to one copy: the copies nobody owns any more are handed off the same way.
        let mut fewer = observed.clone();
        fewer.previous = Some(plan.layout.topology.clone());
        fewer.seen_ring_version = 2;
        for n in &mut fewer.nodes {
            n.report = report(3, 2, 20);
        }
        let back = plan_pool(&one_copy, &one_copy.pools[0], &fewer);
        assert_eq!(back.layout.topology.replicas, 1);
        assert_eq!(back.steps.len(), 4, "{:?}", back.steps);

        // Once the nodes run the new ring, nothing more.
        let mut settled = observed.clone();
        settled.previous = Some(plan.layout.topology.clone());
        settled.seen_ring_version = 2;
        for n in &mut settled.nodes {
            n.report = report(3, 2, 20);
        }
        assert_eq!(
            plan_pool(&two_copies, &two_copies.pools[0], &settled).steps,
            []
        );
    }

    #[test]
    fn zones_learned_for_two_copies_have_every_node_move_its_second_copies() {
        let mut cluster = validated(&[("hot", 3)]);
        cluster.pools[0].replicas = 2;
        let previous = ring::plan_topology(
            &cluster,
            &cluster.pools[0],
            &ring::all_active(3),
            &ring::no_zones(),
            None,
            0,
        );
        let mut observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| NodeView {
                    zone: ring::PodZone::Known(Some(format!("zone-{o}"))),
                    ..node(o, true, true, report(3, 1, 10))
                })
                .collect(),
            previous: Some(previous),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        let topology = &plan.layout.topology;
        assert_eq!(topology.version, 2);
        assert_eq!(topology.members[2].zone.as_deref(), Some("zone-2"));
        let rebalances = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Rebalance(..)))
            .count();
        assert_eq!(rebalances, 3, "{:?}", plan.steps);

        // A node restarting (its zone unknown this pass) keeps its zone: nothing moves.
        observed.previous = Some(topology.clone());
        observed.seen_ring_version = 2;
        for n in &mut observed.nodes {
            n.report = report(3, 2, 10);
        }
        observed.nodes[1].zone = ring::PodZone::Unknown;
        let again = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(&again.layout.topology, topology);
        assert_eq!(again.steps, []);

        // A node of an image from before zones: the ring goes back to none.
        observed.nodes[2].report = report(3, 2, 10).map(|r| NodeReport {
            reads_zones: false,
            ..r
        });
        let without = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(without.layout.topology.version, 3);
        assert!(
            without
                .layout
                .topology
                .members
                .iter()
                .all(|m| m.zone.is_none())
        );
    }

    #[test]
    fn zones_learned_for_one_copy_move_nothing() {
        let cluster = validated(&[("hot", 3)]);
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| NodeView {
                    zone: ring::PodZone::Known(Some(format!("zone-{o}"))),
                    ..node(o, true, true, report(3, 1, 10))
                })
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(plan.layout.topology.version, 2);
        assert!(
            plan.steps.iter().all(|s| matches!(s, Step::PushRing(..))),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn a_node_unready_past_the_grace_leaves_the_key_space_and_returns_when_ready() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let state = |plan: &PoolPlan, o| ring::state_of(&plan.layout.topology, &cluster, pool, o);
        let mut down = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        down.nodes[1] = node(1, false, true, None);
        // Within the grace (a container restart): the ring stays.
        down.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS - 1;
        let brief = plan_pool(&cluster, pool, &down);
        assert_eq!(brief.layout.topology.version, 1);
        assert_eq!(brief.phase, Phase::WaitingForNodes);

        // Past it: out of the key space (joining owns nothing), the others routed to.
        down.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS;
        let out = plan_pool(&cluster, pool, &down);
        assert_eq!(out.layout.topology.version, 2);
        assert_eq!(state(&out, 1), Some(MemberState::Joining));
        assert_eq!(state(&out, 0), Some(MemberState::Active));
        assert_eq!(
            out.steps,
            [Step::PushRing(vec![
                ("demo-hot-0".into(), "10.0.0.0".into()),
                ("demo-hot-2".into(), "10.0.0.2".into()),
            ])]
        );
        assert_eq!(out.phase, Phase::WaitingForNodes);

        // Back and Ready for a moment: active again, and the others hand its keys back
        // (the ones written to them while it was out).
        let mut back = down.clone();
        back.previous = Some(out.layout.topology.clone());
        back.seen_ring_version = 2;
        back.nodes[1] = node(1, true, true, report(3, 2, 0));
        for n in [0, 2] {
            back.nodes[n].report = report(3, 2, 12);
        }
        let returned = plan_pool(&cluster, pool, &back);
        assert_eq!(state(&returned, 1), Some(MemberState::Active));
        assert_eq!(
            returned.steps[1..],
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into()),
            ]
        );
    }

    #[test]
    fn a_node_held_out_takes_no_client_call_until_it_runs_the_ring_that_took_it_out() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let state = |plan: &PoolPlan, o| ring::state_of(&plan.layout.topology, &cluster, pool, o);
        let gated = |o, ready, gate, report| NodeView {
            gate,
            ..node(o, ready, true, report)
        };
        let mut down = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| gated(o, true, Gate::Open, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        // Frozen or cut off past the grace: out of the key space, and its gate closed in
        // the same pass, before any node call that could fail.
        down.nodes[1] = gated(1, false, Gate::Open, None);
        down.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS;
        let out = plan_pool(&cluster, pool, &down);
        assert_eq!(state(&out, 1), Some(MemberState::Joining));
        assert_eq!(out.steps[0], Step::HoldOut(vec!["demo-hot-1".into()]));
        let ring_v2 = out.layout.topology.clone();

        // Back (its containers ready, the gate keeps the pod unready) with the ring from
        // before: it is sent the ring that says it is out, and not admitted yet.
        let mut back = down.clone();
        back.previous = Some(ring_v2.clone());
        back.seen_ring_version = 2;
        for n in [0, 2] {
            back.nodes[n].report = report(3, 2, 12);
        }
        back.nodes[1] = gated(1, false, Gate::Closed { up: true }, report(3, 1, 10));
        back.nodes[1].unready_seconds = 40;
        let behind = plan_pool(&cluster, pool, &back);
        assert_eq!(behind.layout.topology.version, 2);
        assert_eq!(
            behind.steps,
            [Step::PushRing(vec![(
                "demo-hot-1".into(),
                "10.0.0.1".into()
            )])]
        );
        assert_eq!(state(&behind, 1), Some(MemberState::Joining));

        // Running that ring (and so empty): admitted; still out of the key space until
        // its pod has been Ready for a moment.
        back.nodes[1].report = report(3, 2, 0);
        let admitted = plan_pool(&cluster, pool, &back);
        assert_eq!(admitted.steps, [Step::Admit(vec!["demo-hot-1".into()])]);
        assert_eq!(state(&admitted, 1), Some(MemberState::Joining));

        // A node that never answers behind its gate is neither called nor admitted.
        back.nodes[1] = gated(1, false, Gate::Closed { up: false }, None);
        let silent = plan_pool(&cluster, pool, &back);
        assert!(silent.steps.is_empty(), "{:?}", silent.steps);
    }

    #[test]
    fn a_new_pods_gate_opens_once_it_runs_the_ring_and_ungated_pods_are_left_alone() {
        let cluster = validated(&[("hot", 2)]);
        let pool = &cluster.pools[0];
        let mut observed = PoolObservation {
            statefulset_replicas: Some(2),
            nodes: (0..2)
                .map(|o| NodeView {
                    gate: Gate::Closed { up: true },
                    ..node(o, false, true, None)
                })
                .collect(),
            previous: None,
            seen_ring_version: 0,
        };
        let first = plan_pool(&cluster, pool, &observed);
        assert!(
            matches!(first.steps.as_slice(), [Step::PushRing(targets)] if targets.len() == 2),
            "{:?}",
            first.steps
        );
        observed.previous = Some(first.layout.topology.clone());
        observed.seen_ring_version = 1;
        for n in &mut observed.nodes {
            n.report = report(3, 1, 0);
        }
        let second = plan_pool(&cluster, pool, &observed);
        assert_eq!(
            second.steps,
            [Step::Admit(vec!["demo-hot-0".into(), "demo-hot-1".into()])]
        );
        // Pods from a template without the gate: nothing to open or close.
        for n in &mut observed.nodes {
            n.gate = Gate::Ungated;
        }
        observed.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS;
        let ungated = plan_pool(&cluster, pool, &observed);
        assert!(
            !ungated
                .steps
                .iter()
                .any(|s| matches!(s, Step::Admit(_) | Step::HoldOut(_))),
            "{:?}",
            ungated.steps
        );
    }

    #[test]
    fn a_just_admitted_pod_keeps_its_gate_open_when_a_peer_of_its_scale_out_enters() {
        let cluster = validated(&[("hot", 5)]);
        let pool = &cluster.pools[0];
        let mut states = ring::all_active(5);
        states.insert(3, MemberState::Joining);
        states.insert(4, MemberState::Joining);
        let scaling = ring::plan_topology(&cluster, pool, &states, &ring::no_zones(), None, 0);
        let gated = |o, ready, gate| NodeView {
            gate,
            ..node(o, ready, true, report(3, scaling.version, 10))
        };
        // demo-hot-3 has been Ready long enough to enter; demo-hot-4 was admitted the pass
        // before and its kubelet has not marked it Ready yet.
        let observed = PoolObservation {
            statefulset_replicas: Some(5),
            nodes: vec![
                gated(0, true, Gate::Open),
                gated(1, true, Gate::Open),
                gated(2, true, Gate::Open),
                gated(3, true, Gate::Open),
                gated(4, false, Gate::Open),
            ],
            previous: Some(scaling.clone()),
            seen_ring_version: scaling.version,
        };
        let plan = plan_pool(&cluster, pool, &observed);
        assert!(plan.layout.topology.version > scaling.version);
        let state = |o| ring::state_of(&plan.layout.topology, &cluster, pool, o);
        assert_eq!(state(3), Some(MemberState::Active));
        assert_eq!(state(4), Some(MemberState::Joining));
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::HoldOut(_))),
            "{:?}",
            plan.steps
        );

        // A member taken out in the ring last published that never ran it is still held.
        let mut taken_out = observed.clone();
        taken_out.nodes[4].report = report(3, scaling.version - 1, 10);
        let plan = plan_pool(&cluster, pool, &taken_out);
        assert!(
            plan.steps
                .contains(&Step::HoldOut(vec!["demo-hot-4".into()])),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn a_member_on_a_lost_node_leaves_the_key_space_at_detection_though_its_pod_says_ready() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let mut observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        // The pod still says Ready (nothing updates it), its node has been silent 20 s.
        observed.nodes[1].report = None;
        observed.nodes[1].node_lost_seconds = Some(crate::nodeloss::NODE_LOST_AFTER_SECONDS);
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(plan.layout.topology.version, 2);
        assert_eq!(
            ring::state_of(&plan.layout.topology, &cluster, pool, 1),
            Some(MemberState::Joining)
        );
        // The ring goes to the others only: nothing on the lost node is called.
        assert_eq!(
            plan.steps,
            [Step::PushRing(vec![
                ("demo-hot-0".into(), "10.0.0.0".into()),
                ("demo-hot-2".into(), "10.0.0.2".into()),
            ])]
        );
        assert_eq!(plan.phase, Phase::WaitingForNodes);
        assert!(!observed.nodes[1].serving());

        // The same pod on a node that answers is left alone.
        observed.nodes[1].node_lost_seconds = None;
        observed.nodes[1].report = report(3, 1, 10);
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(plan.layout.topology.version, 1);
        assert_eq!(plan.phase, Phase::Settled);
    }

    #[test]
    fn a_lost_node_gets_no_config_push_and_holds_live_config_back_like_an_unready_one() {
        let mut cluster = validated(&[("hot", 2)]);
        cluster.generation = 4;
        let mut observed = PoolObservation {
            statefulset_replicas: Some(2),
            nodes: (0..2)
                .map(|o| node(o, true, true, report(3, 1, 1)))
                .collect(),
            previous: Some(settled_ring(&cluster, 2)),
            seen_ring_version: 1,
        };
        observed.nodes[0].node_lost_seconds = Some(25);
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert!(
            plan.steps
                .iter()
                .all(|s| !matches!(s, Step::PushConfig(name, _) if name == "demo-hot-0")),
            "{:?}",
            plan.steps
        );
    }

    #[test]
    fn when_every_node_is_lost_the_ring_keeps_its_owners() {
        let cluster = validated(&[("hot", 2)]);
        let pool = &cluster.pools[0];
        let observed = PoolObservation {
            statefulset_replicas: Some(2),
            nodes: (0..2)
                .map(|o| NodeView {
                    node_lost_seconds: Some(60),
                    ..node(o, true, true, None)
                })
                .collect(),
            previous: Some(settled_ring(&cluster, 2)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(plan.layout.topology.version, 1);
        assert_eq!(plan.steps, []);
    }

    #[test]
    fn the_last_serving_member_is_never_taken_out_of_the_ring() {
        for shards in [1, 2] {
            let cluster = validated(&[("hot", shards)]);
            let pool = &cluster.pools[0];
            let observed = PoolObservation {
                statefulset_replicas: Some(shards),
                nodes: (0..shards)
                    .map(|o| {
                        let mut n = node(o, false, true, None);
                        n.unready_seconds = 600;
                        n
                    })
                    .collect(),
                previous: Some(settled_ring(&cluster, shards)),
                seen_ring_version: 1,
            };
            let plan = plan_pool(&cluster, pool, &observed);
            assert_eq!(plan.layout.topology.version, 1, "{shards} shards, all down");
            for o in 0..shards {
                assert_eq!(
                    ring::state_of(&plan.layout.topology, &cluster, pool, o),
                    Some(MemberState::Active)
                );
            }
        }
    }

    #[test]
    fn nodes_behind_the_ring_get_it_pushed() {
        let cluster = validated(&[("hot", 2)]);
        let observed = PoolObservation {
            statefulset_replicas: Some(2),
            nodes: vec![
                node(0, true, true, report(3, 1, 0)),
                node(1, true, true, None),
            ],
            previous: Some(settled_ring(&cluster, 2)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            plan.steps,
            [Step::PushRing(vec![(
                "demo-hot-1".into(),
                "10.0.0.1".into()
            )])]
        );
    }

    #[test]
    fn a_template_change_drains_the_highest_node_then_evicts_it() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, false, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(plan.layout.topology.version, 2);
        assert_eq!(
            ring::state_of(&plan.layout.topology, &cluster, pool, 2),
            Some(MemberState::Draining)
        );
        let ips: Vec<(String, String)> = (0..3)
            .map(|o| (format!("demo-hot-{o}"), format!("10.0.0.{o}")))
            .collect();
        assert_eq!(
            plan.steps,
            [
                Step::PushRing(ips),
                Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into()),
                Step::Evict("demo-hot-2".into()),
            ]
        );
        assert_eq!(plan.phase, Phase::Restarting("demo-hot-2".into()));

        // While it restarts it stays draining; nothing else is touched.
        let mut restarting = observed.clone();
        restarting.previous = Some(plan.layout.topology.clone());
        restarting.seen_ring_version = 2;
        restarting.nodes[2] = node(2, false, true, None);
        for n in &mut restarting.nodes[..2] {
            n.report = report(3, 2, 15);
        }
        let waiting = plan_pool(&cluster, pool, &restarting);
        assert_eq!(waiting.layout.topology, plan.layout.topology);
        assert_eq!(waiting.steps, []);

        // Back and Ready on the new template: active again, the others hand its keys back.
        let mut back = restarting.clone();
        back.nodes[2] = node(2, true, true, report(3, 2, 0));
        let returned = plan_pool(&cluster, pool, &back);
        assert_eq!(returned.layout.topology.version, 3);
        assert_eq!(
            ring::state_of(&returned.layout.topology, &cluster, pool, 2),
            Some(MemberState::Active)
        );
        assert_eq!(
            returned.steps[1..],
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-1".into(), "10.0.0.1".into()),
            ]
        );

        // The next pass drains the next node.
        let mut next = back.clone();
        next.previous = Some(returned.layout.topology.clone());
        next.seen_ring_version = 3;
        for n in &mut next.nodes {
            n.report = report(3, 3, 10);
        }
        let following = plan_pool(&cluster, pool, &next);
        assert_eq!(following.phase, Phase::Restarting("demo-hot-1".into()));
        assert_eq!(
            following.steps.last(),
            Some(&Step::Evict("demo-hot-1".into()))
        );
    }

    #[test]
    fn no_restart_starts_while_a_node_is_not_ready() {
        let cluster = validated(&[("hot", 3)]);
        let mut nodes: Vec<NodeView> = (0..3)
            .map(|o| node(o, true, false, report(3, 1, 1)))
            .collect();
        nodes[0].ready = false;
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes,
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert!(!plan.steps.iter().any(|s| matches!(s, Step::Evict(_))));
        assert_eq!(plan.layout.topology.version, 1);
    }

    #[test]
    fn a_one_node_pool_restarts_cold() {
        let cluster = validated(&[("hot", 1)]);
        let observed = PoolObservation {
            statefulset_replicas: Some(1),
            nodes: vec![node(0, true, false, report(3, 1, 5))],
            previous: Some(settled_ring(&cluster, 1)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(plan.steps, [Step::Evict("demo-hot-0".into())]);
        assert_eq!(plan.layout.topology.version, 1);
    }

    #[test]
    fn scale_in_drains_the_highest_nodes_before_the_statefulset_shrinks() {
        let cluster = validated(&[("hot", 2)]);
        let pool = &cluster.pools[0];
        let observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 10)))
                .collect(),
            previous: Some(settled_ring(&cluster, 3)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(
            plan.layout.replicas, 3,
            "keep the leaving node until it is drained"
        );
        assert_eq!(
            ring::state_of(&plan.layout.topology, &cluster, pool, 2),
            Some(MemberState::Draining)
        );
        assert_eq!(
            plan.steps.last(),
            Some(&Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into()))
        );
        assert_eq!(plan.phase, Phase::ScalingIn(vec!["demo-hot-2".into()]));

        // Drained and every node on the new ring: shrink.
        let mut drained = observed.clone();
        drained.previous = Some(plan.layout.topology.clone());
        drained.seen_ring_version = 2;
        for n in &mut drained.nodes {
            n.report = report(3, 2, if n.ordinal == 2 { 0 } else { 15 });
        }
        let shrink = plan_pool(&cluster, pool, &drained);
        assert_eq!(shrink.layout.replicas, 2);
        assert_eq!(shrink.steps, []);

        // Gone: the ring forgets it.
        let mut gone = drained.clone();
        gone.statefulset_replicas = Some(2);
        gone.nodes.truncate(2);
        let after = plan_pool(&cluster, pool, &gone);
        assert_eq!(after.layout.topology.members.len(), 2);
        assert_eq!(after.layout.topology.version, 3);
    }

    #[test]
    fn scale_out_joins_new_nodes_then_moves_their_keys_to_them() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let mut nodes: Vec<NodeView> = (0..2)
            .map(|o| node(o, true, true, report(3, 1, 10)))
            .collect();
        nodes.push(node(2, false, true, None));
        let observed = PoolObservation {
            statefulset_replicas: Some(2),
            nodes,
            previous: Some(settled_ring(&cluster, 2)),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, pool, &observed);
        assert_eq!(
            ring::state_of(&plan.layout.topology, &cluster, pool, 2),
            Some(MemberState::Joining)
        );
        assert_eq!(plan.layout.replicas, 3);
        assert_eq!(plan.phase, Phase::ScalingOut(vec!["demo-hot-2".into()]));

        let mut ready = observed.clone();
        ready.previous = Some(plan.layout.topology.clone());
        ready.seen_ring_version = plan.layout.topology.version;
        ready.nodes[2] = node(2, true, true, report(3, 2, 0));
        // Ready a moment ago: still joining, so peers never route to a name that does not
        // resolve yet.
        let mut just_ready = ready.clone();
        just_ready.nodes[2].ready_seconds = 1;
        assert_eq!(
            ring::state_of(
                &plan_pool(&cluster, pool, &just_ready).layout.topology,
                &cluster,
                pool,
                2
            ),
            Some(MemberState::Joining)
        );
        let joined = plan_pool(&cluster, pool, &ready);
        assert_eq!(
            ring::state_of(&joined.layout.topology, &cluster, pool, 2),
            Some(MemberState::Active)
        );
        assert_eq!(
            joined.steps[1..],
            [
                Step::Rebalance("demo-hot-0".into(), "10.0.0.0".into()),
                Step::Rebalance("demo-hot-1".into(), "10.0.0.1".into()),
            ]
        );
    }

    #[test]
    fn live_config_goes_to_one_node_per_pass_while_the_updated_ones_are_healthy() {
        let mut cluster = validated(&[("hot", 3)]);
        cluster.generation = 4;
        let ring = settled_ring(&cluster, 3);
        let mut observed = PoolObservation {
            statefulset_replicas: Some(3),
            nodes: (0..3)
                .map(|o| node(o, true, true, report(3, 1, 1)))
                .collect(),
            previous: Some(ring),
            seen_ring_version: 1,
        };
        let plan = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            plan.steps,
            [Step::PushConfig("demo-hot-0".into(), "10.0.0.0".into())]
        );
        assert_eq!(plan.phase, Phase::Configuring);

        observed.nodes[0].report = report(4, 1, 1);
        let next = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert_eq!(
            next.steps,
            [Step::PushConfig("demo-hot-1".into(), "10.0.0.1".into())]
        );

        // The node that took the new config is not Ready: stop there.
        observed.nodes[0].ready = false;
        let held = plan_pool(&cluster, &cluster.pools[0], &observed);
        assert!(!held.steps.iter().any(|s| matches!(s, Step::PushConfig(..))));

        for n in &mut observed.nodes {
            n.ready = true;
            n.report = report(4, 1, 1);
        }
        assert_eq!(
            plan_pool(&cluster, &cluster.pools[0], &observed).phase,
            Phase::Settled
        );
    }

    fn settled_with(cluster: &ValidatedCluster, shards: i32) -> PoolObservation {
        PoolObservation {
            statefulset_replicas: Some(shards),
            nodes: (0..shards)
                .map(|o| node(o, true, true, report(3, 1, 1)))
                .collect(),
            previous: Some(settled_ring(cluster, shards)),
            seen_ring_version: 1,
        }
    }

    fn with_memory(limit: &str) -> ValidatedCluster {
        let mut cc = crate::validate::fixtures::cluster(&[("hot", 2)]);
        cc.spec.pools[0].memory_limit = limit.into();
        crate::validate::validate(&cc, &crate::validate::fixtures::defaults()).unwrap()
    }

    #[test]
    fn shrinking_memory_lowers_the_budget_before_the_limit() {
        let smaller = with_memory("256Mi");
        let pool = &smaller.pools[0];
        let mut observed = settled_with(&smaller, 2);
        let plan = plan_pool(&smaller, pool, &observed);
        assert_eq!(
            plan.steps,
            [Step::PushBudget("demo-hot-0".into(), "10.0.0.0".into())]
        );
        assert_eq!(plan.phase, Phase::Resizing("demo-hot-0".into()));
        // Budget lowered: now the limit.
        observed.nodes[0].report.as_mut().unwrap().budget_bytes = pool.budget_bytes;
        let plan = plan_pool(&smaller, pool, &observed);
        assert_eq!(plan.steps, [Step::Resize("demo-hot-0".into())]);
        // Limit applied on node 0: node 1 next.
        observed.nodes[0].memory_limit = Some(pool.memory_limit_bytes);
        observed.nodes[0].memory_applied = Some(pool.memory_limit_bytes);
        let plan = plan_pool(&smaller, pool, &observed);
        assert_eq!(
            plan.steps,
            [Step::PushBudget("demo-hot-1".into(), "10.0.0.1".into())]
        );
    }

    #[test]
    fn growing_memory_raises_the_limit_before_the_budget() {
        let larger = with_memory("1Gi");
        let pool = &larger.pools[0];
        let mut observed = settled_with(&larger, 2);
        let plan = plan_pool(&larger, pool, &observed);
        assert_eq!(plan.steps, [Step::Resize("demo-hot-0".into())]);
        // Spec raised, the kubelet has not applied it yet: wait.
        observed.nodes[0].memory_limit = Some(pool.memory_limit_bytes);
        let plan = plan_pool(&larger, pool, &observed);
        assert_eq!(plan.steps, []);
        assert_eq!(plan.phase, Phase::Resizing("demo-hot-0".into()));
        // Applied: now the budget.
        observed.nodes[0].memory_applied = Some(pool.memory_limit_bytes);
        let plan = plan_pool(&larger, pool, &observed);
        assert_eq!(
            plan.steps,
            [Step::PushBudget("demo-hot-0".into(), "10.0.0.0".into())]
        );
        observed.nodes[0].report.as_mut().unwrap().budget_bytes = pool.budget_bytes;
        let plan = plan_pool(&larger, pool, &observed);
        assert_eq!(plan.steps, [Step::Resize("demo-hot-1".into())]);
    }
    /// The named steps of a pass, one at a time.
    mod steps {
        use super::*;

        fn ring_of(cluster: &ValidatedCluster, states: &[(i32, MemberState)]) -> Topology {
            ring::plan_topology(
                cluster,
                &cluster.pools[0],
                &states.iter().copied().collect(),
                &ring::no_zones(),
                None,
                0,
            )
        }

        #[test]
        fn leaving_counts_the_statefulsets_ordinals_and_the_pods_above_shards() {
            let cluster = validated(&[("hot", 2)]);
            let mut observed = settled_with(&cluster, 2);
            observed.statefulset_replicas = Some(4);
            observed.nodes.push(node(5, true, true, report(3, 1, 0)));
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(pass.leaving(), vec![2, 3, 5]);
            let states = pass.member_states(&pass.leaving());
            assert_eq!(states.get(&5), Some(&MemberState::Draining));
            assert_eq!(states.get(&0), Some(&MemberState::Active));
        }

        #[test]
        fn an_active_member_leaves_the_key_space_only_after_the_grace_and_while_others_serve() {
            let cluster = validated(&[("hot", 3)]);
            let mut observed = settled_with(&cluster, 3);
            observed.nodes[1].ready = false;
            observed.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS - 1;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.member_state(1),
                MemberState::Active,
                "inside the grace"
            );

            observed.nodes[1].unready_seconds = OUT_OF_RING_AFTER_UNREADY_SECONDS;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(pass.member_state(1), MemberState::Joining, "past the grace");

            for other in [0, 2] {
                observed.nodes[other].ready = false;
            }
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.member_state(1),
                MemberState::Active,
                "nobody else serves"
            );
        }

        #[test]
        fn a_joining_member_enters_once_ready_for_a_moment() {
            use MemberState::{Active, Joining};
            let cluster = validated(&[("hot", 3)]);
            let mut observed = settled_with(&cluster, 3);
            observed.previous = Some(ring_of(&cluster, &[(0, Active), (1, Active), (2, Joining)]));
            observed.nodes[2].ready_seconds = ENTER_AFTER_READY_SECONDS - 1;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(pass.member_state(2), Joining);
            assert!(!pass.pool_settled(&pass.member_states(&[]), &[]));

            observed.nodes[2].ready_seconds = ENTER_AFTER_READY_SECONDS;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(pass.member_state(2), Active);
            let states = pass.member_states(&[]);
            assert!(
                !pass.pool_settled(&states, &[]),
                "the ring published last still had a joining member"
            );
        }

        #[test]
        fn a_restart_drains_the_highest_outdated_member_and_a_lone_node_restarts_cold() {
            let cluster = validated(&[("hot", 3)]);
            let mut observed = settled_with(&cluster, 3);
            observed.nodes[0].current_template = false;
            observed.nodes[1].current_template = false;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            let mut states = pass.member_states(&[]);
            assert!(pass.pool_settled(&states, &[]));
            assert_eq!(start_restart(&pass, &mut states), None);
            assert_eq!(states.get(&1), Some(&MemberState::Draining));
            assert_eq!(states.get(&0), Some(&MemberState::Active));
            assert_eq!(
                pass.restarts(&states, None),
                vec![
                    Step::Rebalance("demo-hot-1".into(), "10.0.0.1".into()),
                    Step::Evict("demo-hot-1".into()),
                ]
            );

            let lone = validated(&[("hot", 1)]);
            let mut observed = settled_with(&lone, 1);
            observed.nodes[0].current_template = false;
            let pass = Pass::new(&lone, &lone.pools[0], &observed);
            let mut states = pass.member_states(&[]);
            assert_eq!(start_restart(&pass, &mut states), Some(0));
            assert_eq!(states.get(&0), Some(&MemberState::Active));
            assert_eq!(
                pass.restarts(&states, Some(0)),
                vec![Step::Evict("demo-hot-0".into())]
            );
        }

        #[test]
        fn the_statefulset_shrinks_once_the_leaving_are_drained_and_every_node_runs_the_ring() {
            let cluster = validated(&[("hot", 2)]);
            let mut observed = settled_with(&cluster, 2);
            observed.statefulset_replicas = Some(3);
            observed.nodes.push(node(2, true, true, report(3, 2, 5)));
            for n in &mut observed.nodes[..2] {
                n.report = report(3, 2, 1);
            }
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.statefulset_replicas(&[2], 2, false),
                3,
                "still holds 5"
            );
            observed.nodes[2].report = report(3, 2, 0);
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.statefulset_replicas(&[2], 2, true),
                3,
                "ring just changed"
            );
            assert_eq!(pass.statefulset_replicas(&[2], 3, false), 3, "nodes behind");
            assert_eq!(pass.statefulset_replicas(&[2], 2, false), 2);
            assert_eq!(pass.statefulset_replicas(&[], 9, true), 2, "nobody leaving");
        }

        #[test]
        fn the_ring_goes_to_reachable_nodes_behind_it_and_leaving_nodes_with_entries_hand_off() {
            let cluster = validated(&[("hot", 2)]);
            let mut observed = settled_with(&cluster, 2);
            observed.nodes.push(node(2, true, true, report(3, 1, 4)));
            observed.nodes.push(node(3, true, true, report(3, 2, 0)));
            observed.nodes.push(node(4, false, true, None));
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.ring_push(2),
                Some(Step::PushRing(vec![
                    ("demo-hot-0".into(), "10.0.0.0".into()),
                    ("demo-hot-1".into(), "10.0.0.1".into()),
                    ("demo-hot-2".into(), "10.0.0.2".into()),
                ]))
            );
            assert_eq!(pass.ring_push(1), None);
            let leaving = pass.leaving();
            let states = pass.member_states(&leaving);
            let topology = pass.next_ring(&states);
            assert_eq!(
                pass.handoffs(&leaving, &topology, true),
                vec![Step::Rebalance("demo-hot-2".into(), "10.0.0.2".into())],
                "the drained one and the unreachable one are not asked"
            );
        }

        #[test]
        fn gates_hold_out_an_unready_joining_node_and_admit_one_running_the_ring() {
            use MemberState::{Active, Joining};
            let cluster = validated(&[("hot", 3)]);
            let mut observed = settled_with(&cluster, 3);
            observed.nodes[1].ready = false;
            observed.nodes[1].gate = Gate::Open;
            observed.nodes[2].gate = Gate::Closed { up: true };
            observed.nodes[2].ready = false;
            observed.nodes[2].report = report(3, 4, 0);
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            let states = [(0, Active), (1, Joining), (2, Joining)]
                .into_iter()
                .collect();
            assert_eq!(
                pass.gate_steps(&states, 4),
                vec![
                    Step::HoldOut(vec!["demo-hot-1".into()]),
                    Step::Admit(vec!["demo-hot-2".into()]),
                ]
            );
            assert_eq!(
                pass.gate_steps(&states, 5),
                vec![Step::HoldOut(vec!["demo-hot-1".into()])],
                "not admitted before it runs the ring"
            );
            // Just admitted (its gate open, its pod not Ready yet): it runs the ring, so
            // it is not held out again.
            observed.nodes[2].gate = Gate::Open;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(
                pass.gate_steps(&states, 4),
                vec![Step::HoldOut(vec!["demo-hot-1".into()])]
            );
        }

        #[test]
        fn live_config_waits_while_a_node_on_the_new_generation_is_unready() {
            let cluster = validated(&[("hot", 3)]);
            let target = u64::try_from(cluster.generation).unwrap();
            let mut observed = settled_with(&cluster, 3);
            for n in &mut observed.nodes {
                n.report = report(target - 1, 1, 1);
            }
            observed.nodes[2].report = report(target, 1, 1);
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert!(pass.config_behind());
            assert_eq!(
                pass.config_push(),
                Some(Step::PushConfig("demo-hot-0".into(), "10.0.0.0".into()))
            );
            observed.nodes[2].ready = false;
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            assert_eq!(pass.config_push(), None);
        }

        #[test]
        fn the_phase_names_the_most_disruptive_change_first() {
            use MemberState::{Active, Draining, Joining};
            let cluster = validated(&[("hot", 3)]);
            let observed = settled_with(&cluster, 3);
            let pass = Pass::new(&cluster, &cluster.pools[0], &observed);
            let states: BTreeMap<i32, MemberState> = [(0, Active), (1, Draining), (2, Joining)]
                .into_iter()
                .collect();
            let inputs = |leaving: &'static [i32], resizing| PhaseInputs {
                states: &states,
                leaving,
                cold_restart: None,
                resizing,
                steps: &[],
            };
            assert_eq!(
                pass.phase(&inputs(&[3], Some(0))),
                Phase::ScalingIn(vec!["demo-hot-3".into()])
            );
            assert_eq!(
                pass.phase(&inputs(&[], Some(0))),
                Phase::ScalingOut(vec!["demo-hot-2".into()])
            );
            let all_active: BTreeMap<i32, MemberState> = (0..3).map(|o| (o, Active)).collect();
            let settled = PhaseInputs {
                states: &all_active,
                leaving: &[],
                cold_restart: None,
                resizing: None,
                steps: &[],
            };
            assert_eq!(pass.phase(&settled), Phase::Settled);
            let resizing = PhaseInputs {
                resizing: Some(1),
                ..settled
            };
            assert_eq!(pass.phase(&resizing), Phase::Resizing("demo-hot-1".into()));
        }
    }
}
