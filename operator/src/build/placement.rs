//! Where a pool's pods run by default: spread over zones, then over the nodes within them,
//! and tolerations that let the pods of a lost node go soon. Pure: the pod template's
//! `topologySpreadConstraints` and `tolerations` from the pool's `scheduling`.
//!
//! Why a spread and not the pod anti-affinity the operator used before: anti-affinity on
//! `kubernetes.io/hostname` only keeps pods off each other's nodes; it says nothing of
//! zones, so three pods could all land in one zone and a zone's loss take the whole pool.
//! One spread constraint per level (zone, then node) with `maxSkew: 1` places pods evenly
//! over both, and with `replicas: 2` the nodes put a key's two copies in different zones
//! (the ring carries each member's zone), so a pool spread over two zones keeps every key
//! through the loss of one.
//!
//! The constraints count the pool's own pods (its selector), and only nodes whose taints
//! the pods tolerate (`nodeTaintsPolicy: Honor`): a lost node (tainted unreachable) or a
//! control-plane node is not an empty place the scheduler must fill. `matchLabelKeys:
//! [controller-revision-hash]` is left out on purpose: the StatefulSets restart one pod at
//! a time (`OnDelete`), so during a rollout old and new pods carry different revisions,
//! and a pod spread only against its own revision would ignore where the others run.
//!
//! Imports `names` and `validate` only, like the rest of `build/`.

use k8s_openapi::api::core::v1::{Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// The taint of a node whose kubelet reports it not ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// The taint of a node whose kubelet stopped reporting (lost, partitioned).
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// How long a node pod stays on a node that is not ready or unreachable before it is
/// evicted: 30 s, instead of the 300 s the API server's `DefaultTolerationSeconds` gives
/// every pod.
///
/// Safe for a cache: a pod's entries can be re-warmed (from the clients' misses, or from
/// its volume with `persistence`), and by the time the taint is 30 s old the operator has
/// long taken the member out of the ring (after 10 s unready), so its keys are served by
/// the other nodes — with `replicas: 2` by their second copy. Waiting 5 minutes for a node
/// to come back buys nothing; replacing the pod sooner gets the pool back to full size
/// sooner. A node that is only briefly unready (under the node controller's grace period
/// plus these 30 s) keeps its pods.
///
/// Eviction of a pod on an unreachable node only marks it for deletion: the StatefulSet
/// starts its replacement once the kubelet confirms (the node is back), the Node object is
/// deleted (a cloud provider removing the machine), or the node is tainted
/// `node.kubernetes.io/out-of-service`. The toleration shortens the wait before that, not
/// that rule, which keeps two pods of one identity from ever running at once. For a node
/// that is gone the operator force-deletes the pods itself, before this eviction
/// (`crate::nodeloss`).
pub const NODE_LOST_TOLERATION_SECONDS: i64 = 30;

/// The pod template's topology spread constraints: the user's
/// `scheduling.topologySpreadConstraints` as given (they replace the defaults entirely),
/// else one constraint per `scheduling.spread.topologyKeys` key (default zone, then
/// hostname), `maxSkew: 1` over the pool's pods. `None` when there are none.
pub fn build_spread_constraints(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
) -> Option<Vec<TopologySpreadConstraint>> {
    let scheduling = pool.scheduling.as_ref();
    if let Some(explicit) = scheduling.and_then(|s| s.topology_spread_constraints.clone()) {
        return Some(explicit);
    }
    let spread = scheduling
        .and_then(|s| s.spread.clone())
        .unwrap_or_default();
    let constraints: Vec<TopologySpreadConstraint> = spread
        .topology_keys
        .iter()
        .map(|key| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.clone(),
            when_unsatisfiable: spread.when_unsatisfiable.as_str().to_owned(),
            label_selector: Some(LabelSelector {
                match_labels: Some(names::pool_selector(&cluster.name, &pool.name)),
                ..LabelSelector::default()
            }),
            node_taints_policy: Some("Honor".into()),
            ..TopologySpreadConstraint::default()
        })
        .collect();
    (!constraints.is_empty()).then_some(constraints)
}

/// The pod template's tolerations: the user's, plus a toleration of
/// [`NOT_READY_TAINT`] and [`UNREACHABLE_TAINT`] (`NoExecute`) for
/// [`NODE_LOST_TOLERATION_SECONDS`] each, unless a toleration of the user's names that
/// key or tolerates every key (an empty key with `Exists`): the user's choice stands, and
/// adding ours beside a "tolerate forever" would cut it to 30 s (the shortest matching
/// toleration wins).
pub fn build_tolerations(pool: &ValidatedPool) -> Vec<Toleration> {
    let mut tolerations = pool
        .scheduling
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    for key in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
        if !tolerations.iter().any(|t| names_key(t, key)) {
            tolerations.push(Toleration {
                key: Some(key.to_owned()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(NODE_LOST_TOLERATION_SECONDS),
                value: None,
            });
        }
    }
    tolerations
}

/// Whether `toleration` is about taint `key`: it names it, or tolerates every key.
fn names_key(toleration: &Toleration, key: &str) -> bool {
    match toleration.key.as_deref() {
        Some(named) if !named.is_empty() => named == key,
        _ => toleration.operator.as_deref() == Some("Exists"),
    }
}

#[cfg(test)]
mod tests {
    use crds::cachecluster::{SchedulingSpec, SpreadSpec, WhenUnsatisfiable};

    use super::*;
    use crate::validate::fixtures::{cluster, defaults};
    use crate::validate::validate;

    fn with_scheduling(scheduling: SchedulingSpec) -> ValidatedCluster {
        let mut cc = cluster(&[("hot", 3)]);
        cc.spec.pools[0].scheduling = Some(scheduling);
        validate(&cc, &defaults()).unwrap()
    }

    fn plain() -> ValidatedCluster {
        validate(&cluster(&[("hot", 3)]), &defaults()).unwrap()
    }

    #[test]
    fn pods_spread_over_zones_then_nodes_without_ever_staying_pending_for_it() {
        let cluster = plain();
        let constraints = build_spread_constraints(&cluster, &cluster.pools[0]).unwrap();
        let keys: Vec<&str> = constraints
            .iter()
            .map(|c| c.topology_key.as_str())
            .collect();
        assert_eq!(
            keys,
            ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
        );
        for constraint in &constraints {
            assert_eq!(constraint.max_skew, 1);
            assert_eq!(constraint.when_unsatisfiable, "ScheduleAnyway");
            assert_eq!(constraint.node_taints_policy.as_deref(), Some("Honor"));
            assert_eq!(constraint.match_label_keys, None);
            let selector = constraint.label_selector.as_ref().unwrap();
            assert_eq!(
                selector.match_labels,
                Some(names::pool_selector("demo", "hot"))
            );
        }
    }

    #[test]
    fn the_spread_is_configurable_and_explicit_constraints_replace_it() {
        let strict = with_scheduling(SchedulingSpec {
            spread: Some(SpreadSpec {
                topology_keys: vec!["rack".into()],
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            }),
            ..SchedulingSpec::default()
        });
        let constraints = build_spread_constraints(&strict, &strict.pools[0]).unwrap();
        assert_eq!(constraints.len(), 1);
        assert_eq!(constraints[0].topology_key, "rack");
        assert_eq!(constraints[0].when_unsatisfiable, "DoNotSchedule");

        let none = with_scheduling(SchedulingSpec {
            spread: Some(SpreadSpec {
                topology_keys: Vec::new(),
                when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
            }),
            ..SchedulingSpec::default()
        });
        assert_eq!(build_spread_constraints(&none, &none.pools[0]), None);

        let own = TopologySpreadConstraint {
            max_skew: 2,
            topology_key: "topology.kubernetes.io/region".into(),
            when_unsatisfiable: "DoNotSchedule".into(),
            ..TopologySpreadConstraint::default()
        };
        let explicit = with_scheduling(SchedulingSpec {
            topology_spread_constraints: Some(vec![own.clone()]),
            ..SchedulingSpec::default()
        });
        assert_eq!(
            build_spread_constraints(&explicit, &explicit.pools[0]),
            Some(vec![own])
        );
        let empty = with_scheduling(SchedulingSpec {
            topology_spread_constraints: Some(Vec::new()),
            ..SchedulingSpec::default()
        });
        assert_eq!(
            build_spread_constraints(&empty, &empty.pools[0]),
            Some(Vec::new()),
            "[] means no constraints at all"
        );
        // Affinity does not turn the spread off: they answer different questions.
        let affinity = with_scheduling(SchedulingSpec {
            affinity: Some(Default::default()),
            ..SchedulingSpec::default()
        });
        assert_eq!(
            build_spread_constraints(&affinity, &affinity.pools[0]).map(|c| c.len()),
            Some(2)
        );
    }

    fn toleration(key: Option<&str>, operator: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            operator: Some(operator.into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: seconds,
            value: None,
        }
    }

    #[test]
    fn pods_leave_a_lost_node_after_30_seconds() {
        let cluster = plain();
        let tolerations = build_tolerations(&cluster.pools[0]);
        assert_eq!(
            tolerations,
            [
                toleration(Some(NOT_READY_TAINT), "Exists", Some(30)),
                toleration(Some(UNREACHABLE_TAINT), "Exists", Some(30)),
            ]
        );
    }

    #[test]
    fn the_users_tolerations_come_first_and_win_for_the_keys_they_name() {
        let dedicated = Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("cache".into()),
            effect: Some("NoSchedule".into()),
            toleration_seconds: None,
        };
        let patient = toleration(Some(UNREACHABLE_TAINT), "Exists", Some(600));
        let cluster = with_scheduling(SchedulingSpec {
            tolerations: Some(vec![dedicated.clone(), patient.clone()]),
            ..SchedulingSpec::default()
        });
        assert_eq!(
            build_tolerations(&cluster.pools[0]),
            [
                dedicated,
                patient,
                toleration(Some(NOT_READY_TAINT), "Exists", Some(30)),
            ]
        );
        // Tolerating every taint forever is kept as it is, without a 30 s limit beside it.
        let everything = toleration(None, "Exists", None);
        let cluster = with_scheduling(SchedulingSpec {
            tolerations: Some(vec![everything.clone()]),
            ..SchedulingSpec::default()
        });
        assert_eq!(build_tolerations(&cluster.pools[0]), [everything]);
    }
}
