//! The pure half of running a `CacheInvalidation`: which pools and nodes it must reach,
//! which of them are still to be called, and the status after a pass's calls.
//!
//! A node counts as done once it answered `invalidate-local`; the nodes of a pool are its
//! StatefulSet's ordinals `0..shards` (whether or not their pod exists right now: a pod
//! being recreated is called once it runs, so a node that reloads its disk tier does not
//! keep what the invalidation named) and any other pod of the pool still running (a
//! node draining in a scale-in). The invalidation is Complete when every node of every
//! targeted pool is done, and Failed when its deadline passes first.
//!
//! Owns: that bookkeeping. Pure: no kube client, tokio, network or clock (the controller,
//! `invalidations`, hands in the pods, the call results and the time).

use std::collections::{BTreeMap, BTreeSet};

use crds::cacheinvalidation::{
    self, CacheInvalidationSpec, CacheInvalidationStatus, InvalidationPhase,
    InvalidationPoolStatus, PendingNode, reasons,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::status::set_condition;

/// The most pending nodes listed per pool (the status must stay far below an object's
/// size limit; `status.pendingNodes` counts them all).
pub const MAX_LISTED_PENDING: usize = 64;
/// The longest reason kept for a pending node, in bytes.
pub const MAX_REASON_BYTES: usize = 160;

/// A node of a targeted pool as the pass found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    /// The pod name.
    pub pod: String,
    /// Its IP while its container runs; `None` with why it cannot be called.
    pub address: Result<String, String>,
}

/// A targeted pool and its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    /// The pool.
    pub pool: String,
    /// Its nodes, by pod name.
    pub nodes: Vec<NodeTarget>,
}

/// What one call of `invalidate-local` gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallResult {
    /// The pool.
    pub pool: String,
    /// The pod.
    pub pod: String,
    /// Entries removed, or the error.
    pub outcome: Result<u64, String>,
}

/// Why a pass could not reach any node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// A reason of [`reasons`].
    pub reason: &'static str,
    /// What is wrong, for the condition.
    pub message: String,
}

/// The pools the invalidation targets: `spec.pools`, or every pool of the cluster.
///
/// # Errors
/// [`Blocked`] (`PoolNotFound`) naming the pools the cluster does not have.
pub fn target_pools(
    spec: &CacheInvalidationSpec,
    cluster_pools: &[String],
) -> Result<Vec<String>, Blocked> {
    let Some(wanted) = &spec.pools else {
        return Ok(cluster_pools.to_vec());
    };
    let unknown: Vec<&str> = wanted
        .iter()
        .filter(|pool| !cluster_pools.contains(pool))
        .map(String::as_str)
        .collect();
    if unknown.is_empty() {
        return Ok(wanted.clone());
    }
    Err(Blocked {
        reason: reasons::POOL_NOT_FOUND,
        message: format!(
            "CacheCluster {} has no pool {}; its pools are {}",
            spec.cluster,
            unknown.join(", "),
            cluster_pools.join(", ")
        ),
    })
}

/// The node names of a pool: the StatefulSet `statefulset`'s ordinals `0..shards`, then
/// the pool's other pods that still exist (`existing`), each once.
pub fn pool_node_names(statefulset: &str, shards: i32, existing: &[String]) -> Vec<String> {
    let mut names: Vec<String> = (0..shards.max(0))
        .map(|ordinal| format!("{statefulset}-{ordinal}"))
        .collect();
    for pod in existing {
        if !names.contains(pod) {
            names.push(pod.clone());
        }
    }
    names
}

/// The nodes to call this pass: every node of every target not yet done (and reachable).
pub fn calls<'a>(
    previous: Option<&CacheInvalidationStatus>,
    targets: &'a [PoolTarget],
) -> Vec<(&'a str, &'a NodeTarget)> {
    targets
        .iter()
        .flat_map(|target| {
            let done = done_nodes(previous, &target.pool);
            target
                .nodes
                .iter()
                .filter(move |node| !done.contains(&node.pod) && node.address.is_ok())
                .map(|node| (target.pool.as_str(), node))
        })
        .collect()
}

fn done_nodes(previous: Option<&CacheInvalidationStatus>, pool: &str) -> BTreeSet<String> {
    previous
        .and_then(|status| status.pools.iter().find(|p| p.name == pool))
        .map(|p| p.done_nodes.iter().cloned().collect())
        .unwrap_or_default()
}

/// The status after a pass: the previous one with this pass's call results folded in,
/// every node of every target either done or pending (with its attempts and why), and
/// the phase and conditions that follow. `deadline_passed`: the spec's deadline is
/// behind `now`, so a pass that leaves nodes pending ends it as Failed.
pub fn advance(
    previous: Option<&CacheInvalidationStatus>,
    generation: Option<i64>,
    targets: &[PoolTarget],
    results: &[CallResult],
    now: &Time,
    deadline_passed: bool,
) -> CacheInvalidationStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.start_time.get_or_insert_with(|| now.clone());
    let old_pools: BTreeMap<String, InvalidationPoolStatus> = status
        .pools
        .drain(..)
        .map(|pool| (pool.name.clone(), pool))
        .collect();
    let mut pending_total = 0usize;
    for target in targets {
        let pool = old_pools.get(&target.pool).cloned().unwrap_or_default();
        let (pool, pending) = advance_pool(pool, target, results, now);
        pending_total += pending;
        status.pools.push(pool);
    }
    status.removed = status.pools.iter().map(|pool| pool.removed).sum();
    status.pending_nodes = i32::try_from(pending_total).unwrap_or(i32::MAX);
    let (phase, reason, message) = if pending_total == 0 {
        (
            InvalidationPhase::Complete,
            reasons::INVALIDATED,
            format!("every node ran it: {}", removed_per_pool(&status.pools)),
        )
    } else {
        let message = pending_message(&status.pools, pending_total);
        if deadline_passed {
            (
                InvalidationPhase::Failed,
                reasons::DEADLINE_EXCEEDED,
                message,
            )
        } else {
            (InvalidationPhase::Running, reasons::NODES_PENDING, message)
        }
    };
    conclude(&mut status, generation, phase, reason, &message, now);
    status
}

/// One pool's status after this pass's calls: each node that answered moves to
/// `doneNodes` with what it removed, each other one stays pending with its attempts and
/// why; returns the pool and how many of its nodes are pending (all of them, though at
/// most [`MAX_LISTED_PENDING`] are listed).
fn advance_pool(
    mut pool: InvalidationPoolStatus,
    target: &PoolTarget,
    results: &[CallResult],
    now: &Time,
) -> (InvalidationPoolStatus, usize) {
    pool.name.clone_from(&target.pool);
    let old_pending: BTreeMap<String, PendingNode> = pool
        .pending_nodes
        .drain(..)
        .map(|node| (node.name.clone(), node))
        .collect();
    let mut pending = Vec::new();
    for node in &target.nodes {
        if pool.done_nodes.contains(&node.pod) {
            continue;
        }
        let result = results
            .iter()
            .find(|r| r.pool == target.pool && r.pod == node.pod);
        let mut entry = old_pending.get(&node.pod).cloned().unwrap_or(PendingNode {
            name: node.pod.clone(),
            ..PendingNode::default()
        });
        match (result.map(|r| &r.outcome), &node.address) {
            (Some(Ok(removed)), _) => {
                pool.removed += i64::try_from(*removed).unwrap_or(i64::MAX);
                pool.done_nodes.push(node.pod.clone());
                continue;
            }
            (Some(Err(error)), _) => {
                entry.attempts += 1;
                entry.reason = Some(bounded(error));
            }
            (None, Err(why)) => entry.reason = Some(bounded(why)),
            (None, Ok(_)) => {}
        }
        pending.push(entry);
    }
    let pending_count = pending.len();
    pending.truncate(MAX_LISTED_PENDING);
    pool.pending_nodes = pending;
    if pool.pending_nodes.is_empty() {
        pool.completion_time.get_or_insert_with(|| now.clone());
    } else {
        pool.completion_time = None;
    }
    (pool, pending_count)
}

/// The status of a pass that reached no node (`blocked`): Running while the deadline
/// is ahead (the cluster may be created, a pool added), else Failed.
pub fn blocked(
    previous: Option<&CacheInvalidationStatus>,
    generation: Option<i64>,
    blocked: &Blocked,
    now: &Time,
    deadline_passed: bool,
) -> CacheInvalidationStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.start_time.get_or_insert_with(|| now.clone());
    let (phase, reason) = if deadline_passed {
        (InvalidationPhase::Failed, reasons::DEADLINE_EXCEEDED)
    } else {
        (InvalidationPhase::Running, blocked.reason)
    };
    conclude(
        &mut status,
        generation,
        phase,
        reason,
        &blocked.message,
        now,
    );
    status
}

fn conclude(
    status: &mut CacheInvalidationStatus,
    generation: Option<i64>,
    phase: InvalidationPhase,
    reason: &str,
    message: &str,
    now: &Time,
) {
    status.phase = Some(phase);
    if phase.finished() {
        status.completion_time.get_or_insert_with(|| now.clone());
    }
    let complete = phase == InvalidationPhase::Complete;
    let failed = phase == InvalidationPhase::Failed;
    let conditions = &mut status.conditions;
    set_condition(
        conditions,
        cacheinvalidation::COMPLETE,
        complete,
        reason,
        message,
        generation,
        now,
    );
    let (failed_reason, failed_message) = if failed {
        (reasons::DEADLINE_EXCEEDED, message)
    } else {
        (reasons::AS_EXPECTED, "")
    };
    set_condition(
        conditions,
        cacheinvalidation::FAILED,
        failed,
        failed_reason,
        failed_message,
        generation,
        now,
    );
}

/// `hot: 12 removed on 3 nodes; batch: 0 removed on 2 nodes`.
pub fn removed_per_pool(pools: &[InvalidationPoolStatus]) -> String {
    pools
        .iter()
        .map(|pool| {
            format!(
                "{}: {} removed on {} node{}",
                pool.name,
                pool.removed,
                pool.done_nodes.len(),
                if pool.done_nodes.len() == 1 { "" } else { "s" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn pending_message(pools: &[InvalidationPoolStatus], total: usize) -> String {
    let named: Vec<String> = pools
        .iter()
        .flat_map(|pool| &pool.pending_nodes)
        .take(8)
        .map(|node| match &node.reason {
            Some(reason) => format!("{} ({reason})", node.name),
            None => node.name.clone(),
        })
        .collect();
    let more = total.saturating_sub(named.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{total} node{} not done: {}{tail}",
        if total == 1 { "" } else { "s" },
        named.join(", ")
    )
}

fn bounded(text: &str) -> String {
    if text.len() <= MAX_REASON_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_REASON_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Whether a finished invalidation is due for deletion at `now_seconds` (Unix seconds):
/// its completion time plus `ttlSecondsAfterFinished` has passed. `None` while it is
/// not finished; else the seconds left (0: delete now).
pub fn seconds_until_deletion(
    spec: &CacheInvalidationSpec,
    status: Option<&CacheInvalidationStatus>,
    now_seconds: i64,
) -> Option<i64> {
    let status = status?;
    if !status.phase?.finished() {
        return None;
    }
    let finished = status.completion_time.as_ref()?.0.as_second();
    let due = finished.saturating_add(spec.ttl_seconds_after_finished);
    Some((due - now_seconds).max(0))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn time(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn spec(pools: Option<&[&str]>) -> CacheInvalidationSpec {
        CacheInvalidationSpec {
            cluster: "results".into(),
            pools: pools.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
            keys: None,
            prefixes: None,
            tags: Some(vec!["sales.orders".into()]),
            active_deadline_seconds: 600,
            ttl_seconds_after_finished: 3600,
        }
    }

    fn node(pod: &str, ip: Option<&str>) -> NodeTarget {
        NodeTarget {
            pod: pod.into(),
            address: ip
                .map(str::to_owned)
                .ok_or_else(|| "the pod is not running".to_owned()),
        }
    }

    fn result(pool: &str, pod: &str, outcome: Result<u64, &str>) -> CallResult {
        CallResult {
            pool: pool.into(),
            pod: pod.into(),
            outcome: outcome.map_err(str::to_owned),
        }
    }

    fn condition<'a>(status: &'a CacheInvalidationStatus, type_: &str) -> (&'a str, &'a str) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn unset_pools_mean_every_pool_and_an_unknown_pool_is_named() {
        let cluster = vec!["hot".to_owned(), "batch".to_owned()];
        assert_eq!(target_pools(&spec(None), &cluster).unwrap(), cluster);
        assert_eq!(
            target_pools(&spec(Some(&["batch"])), &cluster).unwrap(),
            vec!["batch".to_owned()]
        );
        let err = target_pools(&spec(Some(&["hot", "cold"])), &cluster).unwrap_err();
        assert_eq!(err.reason, reasons::POOL_NOT_FOUND);
        assert_eq!(
            err.message,
            "CacheCluster results has no pool cold; its pools are hot, batch"
        );
    }

    #[test]
    fn a_pools_nodes_are_its_ordinals_and_its_other_running_pods() {
        let existing = vec!["r-hot-1".to_owned(), "r-hot-3".to_owned()];
        assert_eq!(
            pool_node_names("r-hot", 3, &existing),
            ["r-hot-0", "r-hot-1", "r-hot-2", "r-hot-3"]
        );
    }

    #[test]
    fn a_node_down_stays_pending_and_is_called_again_until_it_answers() {
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes: vec![
                node("r-hot-0", Some("10.0.0.1")),
                node("r-hot-1", Some("10.0.0.2")),
                node("r-hot-2", None),
            ],
        }];
        // Pass 1: two nodes called (the third has no pod running); one answers.
        let first_calls: Vec<&str> = calls(None, &targets)
            .iter()
            .map(|(_, n)| n.pod.as_str())
            .collect();
        assert_eq!(first_calls, ["r-hot-0", "r-hot-1"]);
        let results = [
            result("hot", "r-hot-0", Ok(7)),
            result(
                "hot",
                "r-hot-1",
                Err("node 10.0.0.2:50051: invalidate-local failed: connection refused"),
            ),
        ];
        let first = advance(None, Some(1), &targets, &results, &time(100), false);
        assert_eq!(first.phase, Some(InvalidationPhase::Running));
        assert_eq!((first.removed, first.pending_nodes), (7, 2));
        assert_eq!(
            condition(&first, "Complete"),
            ("False", reasons::NODES_PENDING)
        );
        assert_eq!(condition(&first, "Failed"), ("False", reasons::AS_EXPECTED));
        let pool = &first.pools[0];
        assert_eq!(pool.done_nodes, ["r-hot-0"]);
        assert_eq!(pool.pending_nodes[0].attempts, 1);
        assert_eq!(
            pool.pending_nodes[1].reason.as_deref(),
            Some("the pod is not running")
        );
        assert_eq!(pool.completion_time, None);

        // Pass 2: the done node is not called again; both others now answer.
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes: vec![
                node("r-hot-0", Some("10.0.0.1")),
                node("r-hot-1", Some("10.0.0.2")),
                node("r-hot-2", Some("10.0.0.3")),
            ],
        }];
        let second_calls: Vec<&str> = calls(Some(&first), &targets)
            .iter()
            .map(|(_, n)| n.pod.as_str())
            .collect();
        assert_eq!(second_calls, ["r-hot-1", "r-hot-2"]);
        let results = [
            result("hot", "r-hot-1", Ok(3)),
            result("hot", "r-hot-2", Ok(0)),
        ];
        let second = advance(Some(&first), Some(1), &targets, &results, &time(105), false);
        assert_eq!(second.phase, Some(InvalidationPhase::Complete));
        assert_eq!((second.removed, second.pending_nodes), (10, 0));
        assert_eq!(second.completion_time, Some(time(105)));
        assert_eq!(second.start_time, Some(time(100)));
        assert_eq!(second.pools[0].completion_time, Some(time(105)));
        assert_eq!(
            condition(&second, "Complete"),
            ("True", reasons::INVALIDATED)
        );
        let message = &second.conditions[0].message;
        assert_eq!(message, "every node ran it: hot: 10 removed on 3 nodes");
    }

    #[test]
    fn the_deadline_ends_it_as_failed_naming_the_nodes_left() {
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes: vec![node("r-hot-0", Some("10.0.0.1")), node("r-hot-1", None)],
        }];
        let results = [result("hot", "r-hot-0", Ok(1))];
        let status = advance(None, Some(1), &targets, &results, &time(700), true);
        assert_eq!(status.phase, Some(InvalidationPhase::Failed));
        assert_eq!(
            condition(&status, "Failed"),
            ("True", reasons::DEADLINE_EXCEEDED)
        );
        assert_eq!(
            condition(&status, "Complete"),
            ("False", reasons::DEADLINE_EXCEEDED)
        );
        assert_eq!(
            status.conditions[0].message,
            "1 node not done: r-hot-1 (the pod is not running)"
        );
        assert_eq!(status.completion_time, Some(time(700)));
    }

    #[test]
    fn a_missing_cluster_waits_until_the_deadline() {
        let missing = Blocked {
            reason: reasons::CLUSTER_NOT_FOUND,
            message: "no CacheCluster results in this namespace".into(),
        };
        let waiting = blocked(None, Some(1), &missing, &time(10), false);
        assert_eq!(waiting.phase, Some(InvalidationPhase::Running));
        assert_eq!(
            condition(&waiting, "Complete"),
            ("False", reasons::CLUSTER_NOT_FOUND)
        );
        let failed = blocked(Some(&waiting), Some(1), &missing, &time(700), true);
        assert_eq!(failed.phase, Some(InvalidationPhase::Failed));
        assert_eq!(failed.start_time, Some(time(10)));
    }

    #[test]
    fn a_finished_invalidation_is_deleted_after_its_ttl() {
        let spec = spec(None);
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes: vec![node("r-hot-0", Some("10.0.0.1"))],
        }];
        let running = advance(None, None, &targets, &[], &time(0), false);
        assert_eq!(seconds_until_deletion(&spec, Some(&running), 10_000), None);
        let done = advance(
            None,
            None,
            &targets,
            &[result("hot", "r-hot-0", Ok(0))],
            &time(100),
            false,
        );
        assert_eq!(seconds_until_deletion(&spec, Some(&done), 100), Some(3600));
        assert_eq!(seconds_until_deletion(&spec, Some(&done), 3700), Some(0));
        assert_eq!(seconds_until_deletion(&spec, Some(&done), 9999), Some(0));
    }

    #[test]
    fn long_reasons_and_long_pending_lists_are_bounded() {
        let nodes: Vec<NodeTarget> = (0..100)
            .map(|i| node(&format!("r-hot-{i}"), None))
            .collect();
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes,
        }];
        let long = "x".repeat(1000);
        let results: Vec<CallResult> = Vec::new();
        let mut status = advance(None, None, &targets, &results, &time(0), false);
        assert_eq!(status.pending_nodes, 100);
        assert_eq!(status.pools[0].pending_nodes.len(), MAX_LISTED_PENDING);
        assert!(status.conditions[0].message.ends_with("and 92 more"));
        status.pools[0].pending_nodes.clear();
        let targets = vec![PoolTarget {
            pool: "hot".into(),
            nodes: vec![node("r-hot-0", Some("10.0.0.1"))],
        }];
        let status = advance(
            Some(&status),
            None,
            &targets,
            &[result("hot", "r-hot-0", Err(&long))],
            &time(1),
            false,
        );
        let reason = status.pools[0].pending_nodes[0].reason.as_deref().unwrap();
        assert!(reason.len() <= MAX_REASON_BYTES && reason.ends_with('…'));
    }
}
