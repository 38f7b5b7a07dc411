//! The status the operator reports: a pure computation from what reconcile saw (the
//! write, server-side apply on `/status`, is `apply`'s).
//!
//! `lastTransitionTime` of a condition moves only when its status flips.
//!
//! Owns: [`Outcome`], the conditions and the per-pool status. Pure: no kube client, no
//! node calls, no writes.

use crds::cachecluster::{CacheClusterStatus, NodeStatus, PoolStatus, PoolUsage};
use crds::conditions::{self, reasons};
use crds::node_config::MemberState;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::build::names;
use crate::plan::{NodeView, Phase, PoolObservation, PoolPlan};
use crate::usage;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// What a reconcile pass found.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The spec cannot be acted on; the message names the fields.
    InvalidSpec(String),
    /// A child could not be applied.
    ApplyFailed(String),
    /// Children applied; per-pool counts.
    Reconciled {
        /// Per-pool status, in spec order.
        pools: Vec<PoolStatus>,
        /// Each pool's phase, in the same order.
        phases: Vec<Phase>,
    },
}

/// The Progressing reason of a rollout, from the first pool that is changing: a
/// resize, a live configuration push, a ring change, or (otherwise) a restart.
fn rollout_reason(phases: &[Phase]) -> &'static str {
    match phases.iter().find(|phase| phase.rolling_out()) {
        Some(Phase::Resizing(_)) => reasons::RESIZING,
        Some(Phase::Configuring) => reasons::CONFIGURING,
        Some(Phase::ScalingOut(_) | Phase::ScalingIn(_)) => reasons::REBALANCING,
        _ => reasons::ROLLING_OUT,
    }
}

/// The new status, keeping pool figures and transition times from `previous` where
/// nothing changed.
pub fn compute(
    previous: Option<&CacheClusterStatus>,
    generation: Option<i64>,
    outcome: &Outcome,
    now: &Time,
) -> CacheClusterStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let desired = match outcome {
        Outcome::InvalidSpec(message) => invalid_spec_conditions(message),
        Outcome::ApplyFailed(message) => vec![DesiredCondition {
            type_: conditions::DEGRADED,
            value: true,
            reason: reasons::APPLY_FAILED,
            message: message.clone(),
        }],
        Outcome::Reconciled { pools, phases } => {
            record_pools(&mut status, pools, generation);
            reconciled_conditions(pools, phases)
        }
    };
    for c in desired {
        set_condition(
            &mut status.conditions,
            c.type_,
            c.value,
            c.reason,
            &c.message,
            generation,
            now,
        );
    }
    if !status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY)
    {
        set_condition(
            &mut status.conditions,
            conditions::READY,
            false,
            reasons::SHARDS_NOT_READY,
            "no nodes yet",
            generation,
            now,
        );
    }
    status
        .conditions
        .sort_by_key(|c| conditions::TYPES.iter().position(|t| *t == c.type_));
    status
}

/// A condition as a pass wants it (`set_condition` keeps its transition time).
struct DesiredCondition {
    type_: &'static str,
    value: bool,
    reason: &'static str,
    message: String,
}

/// Degraded with the validation message; nothing progresses until the spec is fixed.
fn invalid_spec_conditions(message: &str) -> Vec<DesiredCondition> {
    vec![
        DesiredCondition {
            type_: conditions::DEGRADED,
            value: true,
            reason: reasons::INVALID_SPEC,
            message: message.to_owned(),
        },
        DesiredCondition {
            type_: conditions::PROGRESSING,
            value: false,
            reason: reasons::INVALID_SPEC,
            message: "the spec must be fixed before anything changes".into(),
        },
    ]
}

/// The pools' figures and the cluster's columns (Pools, Shards, Up-To-Date, Config,
/// Hit-Ratio, Memory) from the pass's per-pool status.
fn record_pools(status: &mut CacheClusterStatus, pools: &[PoolStatus], generation: Option<i64>) {
    let shards: i32 = pools.iter().map(|p| p.shards).sum();
    let ready: i32 = pools.iter().map(|p| p.ready_shards).sum();
    status.pools = pools.to_vec();
    status.pool_names = Some(
        pools
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    status.shards_ready = Some(format!("{ready}/{shards}"));
    status.updated_shards = Some(pools.iter().map(|p| p.updated_shards).sum());
    status.config_generation = generation;
    let usages: Vec<Option<&PoolUsage>> = pools.iter().map(|p| p.usage.as_ref()).collect();
    status.hit_ratio = usage::cluster_hit_ratio(&usages);
    status.memory_used = usage::cluster_memory(&usages);
}

/// Ready, Progressing and Degraded of a pass that reached the end.
fn reconciled_conditions(pools: &[PoolStatus], phases: &[Phase]) -> Vec<DesiredCondition> {
    let shards: i32 = pools.iter().map(|p| p.shards).sum();
    let ready: i32 = pools.iter().map(|p| p.ready_shards).sum();
    let all_ready = ready == shards;
    let (value, reason) = if all_ready {
        (true, reasons::ALL_SHARDS_READY)
    } else {
        (false, reasons::SHARDS_NOT_READY)
    };
    let (progressing, progress_reason, progress_message) = progressing(pools, phases);
    vec![
        DesiredCondition {
            type_: conditions::READY,
            value,
            reason,
            message: format!("{ready}/{shards} nodes ready"),
        },
        DesiredCondition {
            type_: conditions::PROGRESSING,
            value: progressing,
            reason: progress_reason,
            message: progress_message,
        },
        DesiredCondition {
            type_: conditions::DEGRADED,
            value: false,
            reason: reasons::AS_EXPECTED,
            message: "no problems found".into(),
        },
    ]
}

/// The Progressing condition: each changing pool's sentence while a rollout runs, else
/// whether nodes are still starting.
fn progressing(pools: &[PoolStatus], phases: &[Phase]) -> (bool, &'static str, String) {
    let shards: i32 = pools.iter().map(|p| p.shards).sum();
    let ready: i32 = pools.iter().map(|p| p.ready_shards).sum();
    if phases.iter().any(Phase::rolling_out) {
        let changing: Vec<String> = pools
            .iter()
            .zip(phases)
            .filter(|(_, phase)| **phase != Phase::Settled)
            .map(|(p, phase)| format!("pool {}: {}", p.name, pool_sentence(phase, p)))
            .collect();
        let updated: i32 = pools.iter().map(|p| p.updated_shards).sum();
        let message = if changing.is_empty() {
            format!("{updated}/{shards} nodes up to date")
        } else {
            changing.join(" ")
        };
        (true, rollout_reason(phases), message)
    } else if ready == 0 && shards > 0 {
        (true, reasons::CREATING, format!("starting {shards} nodes"))
    } else if ready != shards {
        (
            true,
            reasons::SHARDS_NOT_READY,
            format!("{ready}/{shards} nodes ready"),
        )
    } else {
        (
            false,
            reasons::ROLLOUT_COMPLETE,
            "every node runs the current spec".into(),
        )
    }
}

/// What a pool is doing, in one sentence ending in a full stop: the step under way,
/// why it is safe, and how far it has come.
pub(crate) fn pool_sentence(phase: &Phase, pool: &PoolStatus) -> String {
    let (updated, ready, shards) = (pool.updated_shards, pool.ready_shards, pool.shards);
    let up_to_date = format!("{updated}/{shards} nodes up to date");
    match phase {
        Phase::Settled => format!(
            "Settled: every node runs the current spec and ring; {ready}/{shards} nodes ready."
        ),
        Phase::WaitingForNodes => format!(
            "Waiting for nodes to start and answer before the ring changes; {ready}/{shards} nodes ready."
        ),
        Phase::Configuring => format!(
            "Pushing configuration generation {} to one node at a time, live, without a restart; {}/{shards} nodes run it.",
            pool.config_generation, pool.configured_shards
        ),
        Phase::Resizing(node) => format!(
            "Resizing {node}'s memory in place, without a restart (its byte budget lowered before the limit, raised after it); {up_to_date}."
        ),
        Phase::Restarting(node) => format!(
            "Restarting {node} with handoff: its entries move to its peers before it stops and it serves again once it has its copies back; {up_to_date}."
        ),
        Phase::ScalingOut(joining) => format!(
            "Scaling out: {} join the ring and receive their keys from their peers before they serve; {ready}/{shards} nodes ready.",
            named_nodes(joining)
        ),
        Phase::ScalingIn(leaving) => format!(
            "Scaling in: {} hand their keys to the nodes that stay before they are removed; {ready}/{shards} nodes ready.",
            named_nodes(leaving)
        ),
    }
}

pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if value { "True" } else { "False" };
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    let last_transition_time = match &existing {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let condition = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    };
    match existing {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
}

/// The status of each pool from its plan and what its nodes reported (at most
/// [`MAX_LISTED_NODES`] nodes listed).
pub(crate) fn pool_statuses(
    cluster: &ValidatedCluster,
    plans: &[(PoolPlan, PoolObservation)],
    previous: Option<&CacheClusterStatus>,
    now: &Time,
) -> Vec<PoolStatus> {
    let mut pools: Vec<PoolStatus> = cluster
        .pools
        .iter()
        .zip(plans)
        .map(|(pool, (plan, observation))| {
            let previous = previous.and_then(|s| s.pools.iter().find(|p| p.name == pool.name));
            pool_status(cluster, pool, plan, observation, previous, now)
        })
        .collect();
    limit_listed_nodes(&mut pools, MAX_LISTED_NODES);
    pools
}

/// One pool's status: its counts, phase and sentence, usage and nodes.
fn pool_status(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    plan: &PoolPlan,
    observation: &PoolObservation,
    previous: Option<&PoolStatus>,
    now: &Time,
) -> PoolStatus {
    let target = cluster.generation;
    let at_target = |n: &NodeView| {
        n.report
            .is_some_and(|r| i64::try_from(r.generation).unwrap_or(0) >= target)
    };
    let in_pool: Vec<&NodeView> = observation
        .nodes
        .iter()
        .filter(|n| n.ordinal < pool.shards)
        .collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let mut status = PoolStatus {
        name: pool.name.clone(),
        shards: pool.shards,
        ready_shards: count(in_pool.iter().filter(|n| n.serving()).count()),
        config_generation: target,
        updated_shards: count(
            in_pool
                .iter()
                .filter(|n| n.serving() && n.current_template && at_target(n))
                .count(),
        ),
        configured_shards: count(in_pool.iter().filter(|n| at_target(n)).count()),
        ring_version: i64::try_from(plan.layout.topology.version).unwrap_or(i64::MAX),
        endpoint: Some(names::client_endpoint(
            &cluster.name,
            &pool.name,
            &cluster.namespace,
            cluster.port,
            cluster.tls_secret.is_some(),
        )),
        phase: None,
        memory_resize: memory_resize(pool, observation, previous),
        message: None,
        usage: usage::sample(
            &observation.nodes,
            previous.and_then(|p| p.usage.as_ref()),
            now,
        ),
        nodes: node_statuses(plan, observation),
    };
    let lost = lost_nodes_note(&observation.nodes);
    status.phase = Some(match &lost {
        Some(lost) => format!("{}; {lost}", describe_phase(&plan.phase)),
        None => describe_phase(&plan.phase),
    });
    let sentence = pool_sentence(&plan.phase, &status);
    status.message = Some(match lost {
        Some(lost) => format!("{} {}.", sentence, capitalized(&lost)),
        None => sentence,
    });
    status
}

/// `text` with its first letter in upper case.
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// How the last memory limit change reaches the pool's nodes: in place, or by a
/// restart where the pod cannot be resized; kept from `previous` once done.
fn memory_resize(
    pool: &ValidatedPool,
    observation: &PoolObservation,
    previous: Option<&PoolStatus>,
) -> Option<String> {
    let off_limit = |n: &NodeView| n.memory_limit.is_some_and(|l| l != pool.memory_limit_bytes);
    if !observation.nodes.iter().any(off_limit) {
        return previous.and_then(|p| p.memory_resize.clone());
    }
    // Nodes whose memory cannot change in place are marked outdated.
    let restarting = observation
        .nodes
        .iter()
        .any(|n| off_limit(n) && !n.current_template);
    Some(
        if restarting {
            "RestartWithHandoff"
        } else {
            "InPlace"
        }
        .into(),
    )
}

/// Each observed node as the status lists it.
fn node_statuses(plan: &PoolPlan, observation: &PoolObservation) -> Vec<NodeStatus> {
    observation
        .nodes
        .iter()
        .map(|n| NodeStatus {
            name: n.name.clone(),
            ready: n.serving(),
            state: plan
                .layout
                .topology
                .members
                .iter()
                .find(|m| m.id == n.name)
                .map(|m| m.state.as_str().to_owned()),
            config_generation: n.report.map(|r| i64::try_from(r.generation).unwrap_or(0)),
            ring_version: n.report.map(|r| i64::try_from(r.ring_version).unwrap_or(0)),
            entries: n.report.map(|r| i64::try_from(r.entries).unwrap_or(0)),
            current_template: n.current_template,
        })
        .collect()
}

/// Nodes a pool's phase names; a scale-out or scale-in of more says how many more (a
/// pool of 256 going from 1 to 256 nodes would otherwise write 14 KiB into its phase and
/// as much into the Progressing message, for every pool).
const PHASE_NODES: usize = 8;

/// The nodes a phase names, at most [`PHASE_NODES`] of them.
fn named_nodes(nodes: &[String]) -> String {
    match nodes.get(..PHASE_NODES) {
        Some(named) if nodes.len() > PHASE_NODES => {
            format!("{} and {} more", named.join(","), nodes.len() - PHASE_NODES)
        }
        _ => nodes.join(","),
    }
}

fn describe_phase(phase: &Phase) -> String {
    match phase {
        Phase::Settled => "Settled".into(),
        Phase::WaitingForNodes => "WaitingForNodes".into(),
        Phase::Configuring => "Configuring".into(),
        Phase::Resizing(node) => format!("Resizing {node}"),
        Phase::Restarting(node) => format!("Restarting {node}"),
        Phase::ScalingOut(joining) => format!("ScalingOut {}", named_nodes(joining)),
        Phase::ScalingIn(leaving) => format!("ScalingIn {}", named_nodes(leaving)),
    }
}

/// What a pool's phase adds while some of its pods run on lost Kubernetes nodes
/// (`nodeloss`): each such node, its pods and how long it has been silent, e.g.
/// `node lost: worker-2 (demo-hot-1, 25 s without a heartbeat)`. At most
/// [`PHASE_NODES`] nodes named.
fn lost_nodes_note(nodes: &[NodeView]) -> Option<String> {
    let mut lost: std::collections::BTreeMap<&str, (u64, Vec<&str>)> =
        std::collections::BTreeMap::new();
    for node in nodes {
        if let Some(seconds) = node.node_lost_seconds {
            let entry = lost
                .entry(node.host.as_deref().unwrap_or("?"))
                .or_insert((seconds, Vec::new()));
            entry.0 = entry.0.max(seconds);
            entry.1.push(&node.name);
        }
    }
    if lost.is_empty() {
        return None;
    }
    let count = lost.len();
    let mut named: Vec<String> = lost
        .into_iter()
        .take(PHASE_NODES)
        .map(|(host, (seconds, pods))| {
            format!(
                "{host} ({}, {seconds} s without a heartbeat)",
                pods.join(",")
            )
        })
        .collect();
    if count > PHASE_NODES {
        named.push(format!("and {} more", count - PHASE_NODES));
    }
    Some(format!(
        "node{} lost: {}",
        if count > 1 { "s" } else { "" },
        named.join("; ")
    ))
}

/// Most nodes the status lists in `pools[].nodes`, over all pools.
///
/// A cluster of up to this many nodes has every node listed. A larger one (the CRD
/// allows 16 pools of 256) has the nodes that need attention listed first (not Ready,
/// not active, not on the current template, behind the pool's ring or config), then the
/// others, each kind shared evenly between the pools; the pool's counts
/// (`readyShards`, `updatedShards`, `configuredShards`) cover every node either way.
/// Each node listed costs about 360 bytes of the object etcd stores (its entry, and the
/// managed-fields entry server-side apply records for it): the 4,096 nodes of a cluster
/// at the CRD's limits would take 1.4 MiB of etcd's 1.5 MiB request limit on their own,
/// leaving too little for the spec, and none during a scale-out.
pub const MAX_LISTED_NODES: usize = 2048;

/// Whether `node` is one an operator would look at first: not Ready, not active, on an
/// old template, or behind its pool's ring or config.
fn needs_attention(pool: &PoolStatus, node: &NodeStatus) -> bool {
    !node.ready
        || !node.current_template
        || node.state.as_deref() != Some(MemberState::Active.as_str())
        || node.ring_version != Some(pool.ring_version)
        || node.config_generation != Some(pool.config_generation)
}

/// `budget` shared between wants: an even share each, and what one does not need goes
/// evenly to the others.
fn share(wants: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut left = budget;
    let mut shares = vec![0; wants.len()];
    for (done, &i) in order.iter().enumerate() {
        let even = left / (wants.len() - done);
        shares[i] = wants[i].min(even);
        left -= shares[i];
    }
    shares
}

/// Keeps at most `max` nodes over all `pools` (see [`MAX_LISTED_NODES`]), in their
/// order.
fn limit_listed_nodes(pools: &mut [PoolStatus], max: usize) {
    if pools.iter().map(|p| p.nodes.len()).sum::<usize>() <= max {
        return;
    }
    let attention: Vec<Vec<bool>> = pools
        .iter()
        .map(|pool| {
            pool.nodes
                .iter()
                .map(|n| needs_attention(pool, n))
                .collect()
        })
        .collect();
    let urgent: Vec<usize> = attention
        .iter()
        .map(|flags| flags.iter().filter(|&&f| f).count())
        .collect();
    let urgent_shares = share(&urgent, max);
    let others: Vec<usize> = pools
        .iter()
        .zip(&urgent)
        .map(|(pool, urgent)| pool.nodes.len() - urgent)
        .collect();
    let other_shares = share(&others, max - urgent_shares.iter().sum::<usize>());
    for ((pool, flags), (mut urgent, mut other)) in pools
        .iter_mut()
        .zip(attention)
        .zip(urgent_shares.into_iter().zip(other_shares))
    {
        let mut keep = flags.into_iter().map(|flag| {
            let left = if flag { &mut urgent } else { &mut other };
            let kept = *left > 0;
            *left = left.saturating_sub(1);
            kept
        });
        pool.nodes.retain(|_| keep.next().unwrap_or(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn pool(shards: i32, ready: i32) -> PoolStatus {
        PoolStatus {
            name: "hot".into(),
            shards,
            ready_shards: ready,
            config_generation: 1,
            updated_shards: ready,
            configured_shards: ready,
            ring_version: 1,
            endpoint: Some("grpc://demo-hot.cache.svc:50051".into()),
            phase: Some("Settled".into()),
            memory_resize: None,
            message: None,
            usage: None,
            nodes: Vec::new(),
        }
    }

    fn node(o: usize, ready: bool) -> NodeStatus {
        NodeStatus {
            name: format!("demo-hot-{o}"),
            ready,
            state: Some("active".into()),
            config_generation: Some(1),
            ring_version: Some(1),
            entries: Some(10),
            current_template: true,
        }
    }

    fn with_nodes(name: &str, nodes: usize, unready: &[usize]) -> PoolStatus {
        PoolStatus {
            name: name.into(),
            nodes: (0..nodes).map(|o| node(o, !unready.contains(&o))).collect(),
            ..pool(i32::try_from(nodes).unwrap(), 0)
        }
    }

    #[test]
    fn every_node_is_listed_up_to_the_cap_and_beyond_it_those_needing_attention_first() {
        let mut pools = vec![with_nodes("a", 300, &[7, 250]), with_nodes("b", 10, &[])];
        limit_listed_nodes(&mut pools, 310);
        assert_eq!((pools[0].nodes.len(), pools[1].nodes.len()), (300, 10));

        limit_listed_nodes(&mut pools, 100);
        // The two not Ready come first; the small pool keeps all it has, the large one
        // the rest of the budget, in their order.
        assert_eq!((pools[0].nodes.len(), pools[1].nodes.len()), (90, 10));
        let names: Vec<&str> = pools[0].nodes.iter().map(|n| n.name.as_str()).collect();
        assert!(names.contains(&"demo-hot-250") && names.contains(&"demo-hot-7"));
        assert_eq!(names[..3], ["demo-hot-0", "demo-hot-1", "demo-hot-2"]);
        let behind = |p: &PoolStatus| p.nodes.iter().filter(|n| needs_attention(p, n)).count();
        assert_eq!(behind(&pools[0]), 2);

        // More nodes needing attention than the budget: shared evenly between pools.
        let mut starting = vec![
            with_nodes("a", 256, &(0..256).collect::<Vec<_>>()),
            with_nodes("b", 256, &(0..256).collect::<Vec<_>>()),
        ];
        limit_listed_nodes(&mut starting, 100);
        assert_eq!((starting[0].nodes.len(), starting[1].nodes.len()), (50, 50));
    }

    #[test]
    fn a_pool_with_pods_on_a_lost_node_says_so_in_its_phase() {
        let view = |name: &str, host: &str, lost: Option<u64>| NodeView {
            name: name.into(),
            ordinal: 0,
            ready: true,
            current_template: true,
            ip: None,
            report: None,
            ready_seconds: 0,
            unready_seconds: 0,
            memory_limit: None,
            memory_applied: None,
            zone: crate::ring::PodZone::Unknown,
            image: None,
            host: Some(host.into()),
            node_lost_seconds: lost,
            gate: crate::rollout::Gate::Ungated,
        };
        assert_eq!(
            lost_nodes_note(&[view("demo-hot-0", "worker-1", None)]),
            None
        );
        assert_eq!(
            lost_nodes_note(&[
                view("demo-hot-0", "worker-1", None),
                view("demo-hot-1", "worker-2", Some(25)),
                view("demo-hot-2", "worker-2", Some(26)),
            ])
            .as_deref(),
            Some("node lost: worker-2 (demo-hot-1,demo-hot-2, 26 s without a heartbeat)")
        );
        // Counted as not ready although its pod still says Ready.
        assert!(!view("demo-hot-1", "worker-2", Some(25)).serving());
    }

    #[test]
    fn a_large_scale_out_names_eight_nodes_and_counts_the_others() {
        let joining: Vec<String> = (64..256).map(|o| format!("demo-hot-{o}")).collect();
        assert_eq!(
            describe_phase(&Phase::ScalingOut(joining)),
            "ScalingOut demo-hot-64,demo-hot-65,demo-hot-66,demo-hot-67,demo-hot-68,\
             demo-hot-69,demo-hot-70,demo-hot-71 and 184 more"
        );
        let leaving: Vec<String> = (2..4).map(|o| format!("demo-hot-{o}")).collect();
        assert_eq!(
            describe_phase(&Phase::ScalingIn(leaving)),
            "ScalingIn demo-hot-2,demo-hot-3"
        );
    }

    #[test]
    fn a_rollout_names_what_changes() {
        for (phase, reason) in [
            (Phase::Resizing("demo-hot-1".into()), reasons::RESIZING),
            (Phase::Configuring, reasons::CONFIGURING),
            (
                Phase::ScalingOut(vec!["demo-hot-3".into()]),
                reasons::REBALANCING,
            ),
            (
                Phase::ScalingIn(vec!["demo-hot-2".into()]),
                reasons::REBALANCING,
            ),
            (Phase::Restarting("demo-hot-2".into()), reasons::ROLLING_OUT),
        ] {
            let phases = [Phase::WaitingForNodes, Phase::Settled, phase.clone()];
            assert_eq!(rollout_reason(&phases), reason, "{phase:?}");
        }
    }

    #[test]
    fn the_progressing_message_names_each_changing_pool() {
        let status = compute(
            None,
            Some(1),
            &Outcome::Reconciled {
                pools: vec![pool(3, 3), pool(3, 2)],
                phases: vec![Phase::Settled, Phase::Restarting("demo-hot-2".into())],
            },
            &time(100),
        );
        let progressing = condition(&status, "Progressing");
        assert_eq!(
            progressing.message,
            "pool hot: Restarting demo-hot-2 with handoff: its entries move to its peers before \
             it stops and it serves again once it has its copies back; 2/3 nodes up to date."
        );
    }

    fn condition<'a>(status: &'a CacheClusterStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn conditions_follow_the_outcome() {
        let cases = [
            (
                Outcome::Reconciled {
                    pools: vec![pool(3, 0)],
                    phases: vec![Phase::Settled],
                },
                ("False", "ShardsNotReady"),
                ("True", "Creating"),
                ("False", "AsExpected"),
            ),
            (
                Outcome::Reconciled {
                    pools: vec![pool(3, 2)],
                    phases: vec![Phase::Settled],
                },
                ("False", "ShardsNotReady"),
                ("True", "ShardsNotReady"),
                ("False", "AsExpected"),
            ),
            (
                Outcome::Reconciled {
                    pools: vec![pool(3, 3)],
                    phases: vec![Phase::Restarting("demo-hot-0".into())],
                },
                ("True", "AllShardsReady"),
                ("True", "RollingOut"),
                ("False", "AsExpected"),
            ),
            (
                Outcome::Reconciled {
                    pools: vec![pool(3, 3)],
                    phases: vec![Phase::Settled],
                },
                ("True", "AllShardsReady"),
                ("False", "RolloutComplete"),
                ("False", "AsExpected"),
            ),
            (
                Outcome::InvalidSpec("spec.pools[hot].shards: bad".into()),
                ("False", "ShardsNotReady"),
                ("False", "InvalidSpec"),
                ("True", "InvalidSpec"),
            ),
        ];
        for (outcome, ready, progressing, degraded) in cases {
            let status = compute(None, Some(2), &outcome, &time(100));
            for (type_, (value, reason)) in [
                ("Ready", ready),
                ("Progressing", progressing),
                ("Degraded", degraded),
            ] {
                let c = condition(&status, type_);
                assert_eq!(
                    (c.status.as_str(), c.reason.as_str()),
                    (value, reason),
                    "{outcome:?} {type_}"
                );
                assert_eq!(c.observed_generation, Some(2));
            }
            assert_eq!(status.observed_generation, Some(2));
        }
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let first = compute(
            None,
            Some(1),
            &Outcome::Reconciled {
                pools: vec![pool(3, 1)],
                phases: vec![Phase::Settled],
            },
            &time(100),
        );
        let same = compute(
            Some(&first),
            Some(1),
            &Outcome::Reconciled {
                pools: vec![pool(3, 2)],
                phases: vec![Phase::Settled],
            },
            &time(200),
        );
        assert_eq!(condition(&same, "Ready").last_transition_time, time(100));
        let flipped = compute(
            Some(&same),
            Some(1),
            &Outcome::Reconciled {
                pools: vec![pool(3, 3)],
                phases: vec![Phase::Settled],
            },
            &time(300),
        );
        assert_eq!(condition(&flipped, "Ready").last_transition_time, time(300));
        assert_eq!(flipped.shards_ready.as_deref(), Some("3/3"));
        assert_eq!(flipped.pool_names.as_deref(), Some("hot"));
    }
}
