//! Node loss: when a whole Kubernetes node has gone silent, and what to do about the
//! cluster's pods on it. Pure: decisions from the Nodes, their heartbeat Leases, the pods
//! and their volumes as observed (`observe`); the writes are `execute`'s.
//!
//! A node that dies whole (kubelet, runtime and pods at once, its network silent) updates
//! nothing: its pods stay `Ready` in the API until the node lifecycle controller's grace
//! (`--node-monitor-grace-period`, 50 s by default) marks them NotReady, and eviction
//! afterwards only marks them Terminating — with the kubelet gone the StatefulSet never
//! gets to start the replacement. The operator does not wait for that:
//!
//! - **Lost** ([`NodeHealth::lost_seconds`]): the node's heartbeat Lease
//!   (`kube-node-lease/<node>`, renewed every 10 s by the kubelet) has not been renewed for
//!   [`NODE_LOST_AFTER_SECONDS`] (two missed renewals); or, when the Lease cannot be read,
//!   the node controller already says so: Ready `Unknown`/`False` and the
//!   [`UNREACHABLE_TAINT`]. A Lease renewed within the threshold outweighs the taint: the
//!   kubelet is back and the node controller has not caught up yet.
//! - **Out of the ring and off the Services at once**: the planner treats the node's pods
//!   as unready since its last heartbeat (`plan`), and their `Ready` condition is patched
//!   to `False` (reason [`NODE_LOST_REASON`]) as the node controller would ~30 s later; the
//!   EndpointSlice controller then drops them from the client and headless Services. A
//!   kubelet that comes back rewrites the condition itself.
//! - **Replaced elsewhere** ([`NodeHealth::force_delete_due`]): once the node has been
//!   silent for [`FORCE_DELETE_AFTER_SECONDS`] *and* the node controller has tainted it
//!   unreachable or not-ready with `NoSchedule` (so the scheduler will not put the
//!   replacement back on it), its pods are force-deleted (grace period 0) and the
//!   StatefulSet starts them on other nodes; node-local claims go first
//!   ([`node_local_claims`]). At most one node's pods per pass, and only while some other
//!   node's Lease is fresh ([`others_alive`]).
//!
//! Safe for a cache: a pod force-deleted on a node that is only partitioned is already out
//! of the ring and off the Services, so nobody routes to it; what it held re-warms (read
//! repair, the second copy with `replicas: 2`, misses); when the node returns its kubelet
//! finds the pod deleted and stops the orphan. Not done for a slow kubelet: two missed
//! heartbeats alone mark the pods NotReady (reversible), the delete also needs the node
//! controller's own verdict (its taint, after its 50 s grace).
//!
//! Clocks: a heartbeat's age is the operator's clock minus the kubelet's `renewTime`, so
//! it assumes the nodes' clocks agree within seconds (NTP, as TLS and Lease-based leader
//! election already need). A kubelet clock 20 s behind makes its node look lost: its
//! pods are marked NotReady and leave the ring — which the kubelet undoes on its next
//! status sync — but are never force-deleted, which also needs the node controller's
//! taint, a verdict that compares no clocks.
//!
//! Owns: the constants above, [`NodeHealth`], [`NodeLossPlan`]. Must not import kube's
//! client, tokio or any I/O (checked by `scripts/check-layers`); imports `build` for the
//! taint names only.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, PersistentVolume, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

pub use crate::build::placement::{NOT_READY_TAINT, UNREACHABLE_TAINT};

/// How long a node's heartbeat Lease may go unrenewed before the node is lost: two
/// missed renewals of the kubelet's default 10 s (`nodeLeaseDurationSeconds` 40 s / 4).
pub const NODE_LOST_AFTER_SECONDS: u64 = 20;

/// How long since its last heartbeat a lost node's pods wait before they are
/// force-deleted (besides the node controller's `NoSchedule` taint, which with the default
/// 50 s grace comes later and so decides).
pub const FORCE_DELETE_AFTER_SECONDS: u64 = 30;

/// The namespace of the kubelets' heartbeat Leases (one per node, named like the node).
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The reason of the `Ready=False` condition the operator writes on a lost node's pods,
/// and of its Warning event.
pub const NODE_LOST_REASON: &str = "NodeLost";

/// The Node label the kubelet sets to its hostname (a local volume's node affinity names
/// it; on some clouds it differs from the Node's name).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What is known of one Node's health this pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    /// Seconds since its last heartbeat (Lease renewal), when the Lease was read.
    pub heartbeat_age: Option<u64>,
    /// Its `Ready` condition's status (`True`, `False`, `Unknown`), when the Node was read.
    pub ready: Option<String>,
    /// Seconds since the `Ready` condition's `lastHeartbeatTime` (a fallback for the
    /// heartbeat age when the Lease cannot be read).
    pub ready_heartbeat_age: Option<u64>,
    /// It carries the node controller's [`UNREACHABLE_TAINT`] (any effect).
    pub unreachable: bool,
    /// The node controller's taint that keeps new pods off it: [`UNREACHABLE_TAINT`] or
    /// [`NOT_READY_TAINT`] with effect `NoSchedule`, whichever it carries.
    pub no_schedule_taint: Option<&'static str>,
    /// Its `kubernetes.io/hostname` label.
    pub hostname: Option<String>,
}

impl NodeHealth {
    /// Seconds since the node's last heartbeat, when it is lost (see the module doc);
    /// `None` when it is not, or nothing says so.
    pub fn lost_seconds(&self) -> Option<u64> {
        if let Some(age) = self.heartbeat_age {
            return (age >= NODE_LOST_AFTER_SECONDS).then_some(age);
        }
        let unready = matches!(self.ready.as_deref(), Some("Unknown" | "False"));
        (unready && self.unreachable).then(|| {
            self.ready_heartbeat_age
                .unwrap_or(0)
                .max(NODE_LOST_AFTER_SECONDS)
        })
    }

    /// Whether the node's pods are to be force-deleted: lost for
    /// [`FORCE_DELETE_AFTER_SECONDS`] and tainted `NoSchedule` by the node controller.
    pub fn force_delete_due(&self) -> bool {
        self.no_schedule_taint.is_some()
            && self
                .lost_seconds()
                .is_some_and(|lost| lost >= FORCE_DELETE_AFTER_SECONDS)
    }
}

/// Whole seconds from `then` to `now` (0 when `then` is later).
fn seconds_between(then: &k8s_openapi::jiff::Timestamp, now: &Time) -> u64 {
    u64::try_from(now.0.as_second() - then.as_second()).unwrap_or(0)
}

/// Seconds since the node's last heartbeat by its Lease (`spec.renewTime`), as of
/// `now`; 0 for a renewal in the future (a kubelet clock ahead of ours). `None` when the
/// Lease has no renewal time.
pub fn heartbeat_age(lease: &Lease, now: &Time) -> Option<u64> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?;
    Some(seconds_between(&renewed.0, now))
}

/// The health of a node from its Node object and its Lease (either may be unknown), as
/// of `now`.
pub fn node_health(node: Option<&Node>, lease: Option<&Lease>, now: &Time) -> NodeHealth {
    let ready = node
        .and_then(|n| n.status.as_ref()?.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    let taints = node
        .and_then(|n| n.spec.as_ref()?.taints.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let no_schedule_taint = [UNREACHABLE_TAINT, NOT_READY_TAINT]
        .into_iter()
        .find(|key| {
            taints
                .iter()
                .any(|t| t.key == *key && t.effect == "NoSchedule")
        });
    NodeHealth {
        heartbeat_age: lease.and_then(|lease| heartbeat_age(lease, now)),
        ready: ready.map(|c| c.status.clone()),
        ready_heartbeat_age: ready
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| seconds_between(&t.0, now)),
        unreachable: taints.iter().any(|t| t.key == UNREACHABLE_TAINT),
        no_schedule_taint,
        hostname: node.and_then(|n| n.labels().get(HOSTNAME_LABEL).cloned()),
    }
}

/// When to look again so that a node whose heartbeats stop now is found lost on time:
/// the seconds until the stalest known heartbeat among `healthy` nodes turns
/// [`NODE_LOST_AFTER_SECONDS`] old (at least 1). `None` when no heartbeat is known (no
/// Lease readable): the pass then wakes up as before, on changes to what it owns.
pub fn next_check<'a>(health: impl IntoIterator<Item = &'a NodeHealth>) -> Option<u64> {
    health
        .into_iter()
        .filter(|h| h.lost_seconds().is_none())
        .filter_map(|h| h.heartbeat_age)
        .map(|age| NODE_LOST_AFTER_SECONDS.saturating_sub(age).max(1))
        .min()
}

/// The Node a pod is bound to.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|name| !name.is_empty())
}

/// The claims a StatefulSet made for `pod` from its volume claim templates: its volumes
/// whose claim is named `<volume>-<pod>` (the StatefulSet names a template's claim
/// after the template and the pod, and the volume after the template). Claims the user
/// mounts under other names are not the StatefulSet's and never considered.
pub fn template_claims(pod: &Pod) -> Vec<String> {
    let name = pod.name_any();
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|volume| {
            let claim = &volume.persistent_volume_claim.as_ref()?.claim_name;
            (*claim == format!("{}-{name}", volume.name)).then(|| claim.clone())
        })
        .collect()
}

/// A pod to force-delete, with the claims that may have to go first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodToDelete {
    /// Pod name.
    pub name: String,
    /// Its UID: the delete is conditional on it, so a replacement of the same name is
    /// never deleted.
    pub uid: Option<String>,
    /// Its StatefulSet claims ([`template_claims`]); which of them go is decided once
    /// their volumes are read ([`node_local_claims`]).
    pub claims: Vec<String>,
}

/// One lost node the cluster's pods run on, and what this pass does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostNode {
    /// Node name.
    pub node: String,
    /// Its `kubernetes.io/hostname` label, when read.
    pub hostname: Option<String>,
    /// Seconds since its last heartbeat.
    pub lost_seconds: u64,
    /// The cluster's pods on it.
    pub pods: Vec<String>,
    /// Those whose `Ready` condition is still `True`: to patch `False`.
    pub mark_not_ready: Vec<String>,
    /// The taint that makes the force delete due, when it is.
    pub force_delete_taint: Option<&'static str>,
    /// The pods to force-delete this pass (empty unless due and this node's turn).
    pub force_delete: Vec<PodToDelete>,
}

/// What the pass does about lost nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLossPlan {
    /// Each lost node the cluster's pods run on, longest silent first.
    pub lost: Vec<LostNode>,
}

impl NodeLossPlan {
    /// Whether any of the cluster's pods runs on a lost node.
    pub fn any(&self) -> bool {
        !self.lost.is_empty()
    }

    /// The node whose pods are force-deleted this pass, if any.
    pub fn force_deleting(&self) -> Option<&LostNode> {
        self.lost.iter().find(|lost| !lost.force_delete.is_empty())
    }
}

/// What to do this pass about the lost nodes `pods` run on (`health`: by Node name).
///
/// Every pod on a lost node whose `Ready` condition is still `True` is marked NotReady.
/// The pods of **one** node whose force delete is due — the longest silent — are
/// force-deleted per pass: several nodes lost at once (or a fault that only looks like
/// it) are taken one by one, each pass (2 s apart while the pool waits for nodes)
/// re-reading Leases and taints first.
pub fn plan_node_loss(pods: &[Pod], health: &BTreeMap<String, NodeHealth>) -> NodeLossPlan {
    let mut lost: Vec<LostNode> = Vec::new();
    for pod in pods {
        let Some(node) = node_of(pod) else { continue };
        let Some(node_health) = health.get(node) else {
            continue;
        };
        let Some(lost_seconds) = node_health.lost_seconds() else {
            continue;
        };
        let index = match lost.iter().position(|l| l.node == node) {
            Some(index) => index,
            None => {
                lost.push(LostNode {
                    node: node.to_owned(),
                    hostname: node_health.hostname.clone(),
                    lost_seconds,
                    pods: Vec::new(),
                    mark_not_ready: Vec::new(),
                    force_delete_taint: node_health
                        .force_delete_due()
                        .then_some(node_health.no_schedule_taint)
                        .flatten(),
                    force_delete: Vec::new(),
                });
                lost.len() - 1
            }
        };
        let entry = &mut lost[index];
        entry.pods.push(pod.name_any());
        if crate::rollout::ready_condition_true(pod) {
            entry.mark_not_ready.push(pod.name_any());
        }
    }
    lost.sort_by(|a, b| {
        b.lost_seconds
            .cmp(&a.lost_seconds)
            .then_with(|| a.node.cmp(&b.node))
    });
    if let Some(first_due) = lost.iter_mut().find(|l| l.force_delete_taint.is_some()) {
        first_due.force_delete = pods
            .iter()
            .filter(|pod| node_of(pod) == Some(first_due.node.as_str()))
            .map(|pod| PodToDelete {
                name: pod.name_any(),
                uid: pod.uid(),
                claims: template_claims(pod),
            })
            .collect();
    }
    NodeLossPlan { lost }
}

/// Whether the API server still hears from some node other than `lost`: a Lease of
/// another node renewed within [`NODE_LOST_AFTER_SECONDS`]. A control plane cut off from
/// every node sees every node lost (and Kubernetes then stops evicting); deleting every
/// pod would only turn a network fault into a cold restart of every pool.
pub fn others_alive(leases: &[Lease], lost: &str, now: &Time) -> bool {
    leases.iter().any(|lease| {
        lease.name_any() != lost
            && heartbeat_age(lease, now).is_some_and(|age| age < NODE_LOST_AFTER_SECONDS)
    })
}

/// A StatefulSet claim of a pod on a lost node, as read: its UID and the volume bound to
/// it (`None`: unbound, or the volume cannot be read).
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedClaim {
    /// Claim name.
    pub name: String,
    /// Claim UID (the delete is conditional on it).
    pub uid: Option<String>,
    /// The PersistentVolume bound to it.
    pub volume: Option<PersistentVolume>,
}

/// The claims to delete before force-deleting a pod of the lost node `node` (its
/// `kubernetes.io/hostname` label `hostname`): those bound to a volume that can only be
/// used on that node, so that the StatefulSet makes a fresh claim with the new pod on
/// another node (the pod starts empty and re-warms from its peers). A volume any other
/// node can attach (a network disk, even one pinned to a zone) stays.
pub fn node_local_claims<'a>(
    claims: &'a [ObservedClaim],
    node: &str,
    hostname: Option<&str>,
) -> Vec<&'a ObservedClaim> {
    claims
        .iter()
        .filter(|claim| {
            claim
                .volume
                .as_ref()
                .is_some_and(|pv| pinned_to(pv, node, hostname))
        })
        .collect()
}

/// Whether `pv` can only be used on node `node`: a required node affinity each of whose
/// terms admits that node alone, by `kubernetes.io/hostname` (`In` the node's hostname
/// label or name) or by the field `metadata.name`. This is what local-path, `local` and
/// hostPath volumes carry; a zonal disk's affinity names a zone and is not pinned.
pub fn pinned_to(pv: &PersistentVolume, node: &str, hostname: Option<&str>) -> bool {
    let names_this_node = |value: &String| value == node || Some(value.as_str()) == hostname;
    let pins = |requirement: &NodeSelectorRequirement, key: &str| {
        requirement.key == key
            && requirement.operator == "In"
            && requirement
                .values
                .as_ref()
                .is_some_and(|values| !values.is_empty() && values.iter().all(names_this_node))
    };
    let Some(terms) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return false;
    };
    !terms.is_empty()
        && terms.iter().all(|term| {
            term.match_expressions
                .iter()
                .flatten()
                .any(|r| pins(r, HOSTNAME_LABEL))
                || term
                    .match_fields
                    .iter()
                    .flatten()
                    .any(|r| pins(r, "metadata.name"))
        })
}

/// The Warning event's note when the pods of `lost` were marked NotReady (`marked`).
pub fn marked_note(lost: &LostNode, marked: &[String]) -> String {
    format!(
        "node {} lost (no heartbeat for {} s): {} marked NotReady (off the Services) and taken \
         out of the ring; they are started on other nodes once the node controller taints the \
         node (and it has been silent for {FORCE_DELETE_AFTER_SECONDS} s)",
        lost.node,
        lost.lost_seconds,
        marked.join(", "),
    )
}

/// The Warning event's note when the pods of `lost` were force-deleted (`deleted`, and
/// the node-local claims `claims` deleted before them).
pub fn force_deleted_note(lost: &LostNode, deleted: &[String], claims: &[String]) -> String {
    let claims = if claims.is_empty() {
        String::new()
    } else {
        format!(" and the node-local claims {}", claims.join(", "))
    };
    format!(
        "node {} lost for {} s and tainted {}: force-deleted {}{claims} so the StatefulSet starts \
         them on other nodes (they re-warm from their peers); if the node comes back, its \
         kubelet stops the old containers",
        lost.node,
        lost.lost_seconds,
        lost.force_delete_taint.unwrap_or(UNREACHABLE_TAINT),
        deleted.join(", "),
    )
}

/// The pod status patch that marks a pod on lost node `node` NotReady, as of `now`: a
/// strategic merge patch of `status.conditions` (merged by `type`, so the other
/// conditions stay), as the node controller's `MarkPodsNotReady` does later. It closes the
/// pod's readiness gate in the same write: a kubelet that comes back and rewrites `Ready`
/// from what it knew before must find the gate closed, whatever it reads first.
pub fn not_ready_patch(node: &str, lost_seconds: u64, now: &Time) -> serde_json::Value {
    let message = format!(
        "node {node} lost: no heartbeat for {lost_seconds} s (marked by flightcache-operator)"
    );
    serde_json::json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "False",
        "reason": NODE_LOST_REASON,
        "message": message,
        "lastTransitionTime": now,
    }, {
        "type": crate::build::names::IN_RING_CONDITION,
        "status": "False",
        "reason": NODE_LOST_REASON,
        "message": message,
        "lastTransitionTime": now,
    }]}})
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{
        NodeCondition, NodeSelector, NodeSelectorTerm, NodeSpec, NodeStatus,
        PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PodCondition, PodSpec, PodStatus,
        Taint, Volume, VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn lease(name: &str, renewed: Option<i64>) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some(name.into());
        lease.spec = Some(LeaseSpec {
            renew_time: renewed.map(|s| MicroTime(at(s).0)),
            ..LeaseSpec::default()
        });
        lease
    }

    fn node(ready: &str, heartbeat: i64, taints: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("worker-2".into());
        node.labels_mut()
            .insert(HOSTNAME_LABEL.into(), "worker-2.local".into());
        node.spec = Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(key, effect)| Taint {
                        key: (*key).into(),
                        effect: (*effect).into(),
                        ..Taint::default()
                    })
                    .collect(),
            ),
            ..NodeSpec::default()
        });
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(at(heartbeat)),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        node
    }

    #[test]
    fn a_node_is_lost_after_two_missed_heartbeats() {
        let now = at(1_000);
        let healthy = node("True", 990, &[]);
        for (renewed, lost) in [(995, None), (981, None), (980, Some(20)), (940, Some(60))] {
            let health = node_health(
                Some(&healthy),
                Some(&lease("worker-2", Some(renewed))),
                &now,
            );
            assert_eq!(health.lost_seconds(), lost, "renewed at {renewed}");
        }
    }

    #[test]
    fn a_heartbeat_is_never_younger_than_zero_and_unknown_without_a_renewal() {
        let now = at(1_000);
        assert_eq!(heartbeat_age(&lease("worker-2", Some(993)), &now), Some(7));
        assert_eq!(
            heartbeat_age(&lease("worker-2", Some(1_030)), &now),
            Some(0)
        );
        assert_eq!(heartbeat_age(&lease("worker-2", None), &now), None);
        assert_eq!(heartbeat_age(&Lease::default(), &now), None);
    }

    #[test]
    fn without_a_lease_the_node_controllers_verdict_decides() {
        let now = at(1_000);
        let unreachable = node(
            "Unknown",
            945,
            &[
                (UNREACHABLE_TAINT, "NoSchedule"),
                (UNREACHABLE_TAINT, "NoExecute"),
            ],
        );
        let health = node_health(Some(&unreachable), None, &now);
        assert_eq!(health.lost_seconds(), Some(55));
        assert!(health.force_delete_due());
        assert_eq!(health.no_schedule_taint, Some(UNREACHABLE_TAINT));
        assert_eq!(health.hostname.as_deref(), Some("worker-2.local"));
        // NotReady without the unreachable taint (a kubelet that reports, say, a network
        // plugin down) is not lost.
        let not_ready = node("False", 995, &[(NOT_READY_TAINT, "NoSchedule")]);
        assert_eq!(
            node_health(Some(&not_ready), None, &now).lost_seconds(),
            None
        );
        // Nothing readable: not lost.
        assert_eq!(node_health(None, None, &now).lost_seconds(), None);
        // A fresh lease outweighs a taint the node controller has not lifted yet.
        let back = node_health(
            Some(&unreachable),
            Some(&lease("worker-2", Some(998))),
            &now,
        );
        assert_eq!(back.lost_seconds(), None);
        assert!(!back.force_delete_due());
    }

    #[test]
    fn pods_are_force_deleted_only_after_the_bound_and_the_node_controllers_taint() {
        let now = at(1_000);
        let lease_at = |s| lease("worker-2", Some(s));
        // Silent 25 s, no taint yet: lost, not due.
        let early = node_health(Some(&node("True", 975, &[])), Some(&lease_at(975)), &now);
        assert_eq!(early.lost_seconds(), Some(25));
        assert!(!early.force_delete_due());
        // Silent 45 s, still no taint (a node controller with a longer grace): not due.
        let untainted = node_health(Some(&node("True", 955, &[])), Some(&lease_at(955)), &now);
        assert!(!untainted.force_delete_due());
        // The taint, but silent only 25 s (a short grace): not due yet.
        let tainted = [(NOT_READY_TAINT, "NoSchedule")];
        let soon = node_health(
            Some(&node("Unknown", 975, &tainted)),
            Some(&lease_at(975)),
            &now,
        );
        assert!(!soon.force_delete_due());
        // Both: due. A NoExecute taint alone is not enough.
        let due = node_health(
            Some(&node("Unknown", 950, &tainted)),
            Some(&lease_at(950)),
            &now,
        );
        assert!(due.force_delete_due());
        let no_execute_only = node_health(
            Some(&node("Unknown", 950, &[(UNREACHABLE_TAINT, "NoExecute")])),
            Some(&lease_at(950)),
            &now,
        );
        assert!(!no_execute_only.force_delete_due());
    }

    #[test]
    fn the_next_check_comes_when_the_stalest_heartbeat_would_turn_lost() {
        let healthy = |age| NodeHealth {
            heartbeat_age: Some(age),
            ..NodeHealth::default()
        };
        assert_eq!(next_check([&healthy(3), &healthy(8)]), Some(12));
        assert_eq!(next_check([&healthy(19)]), Some(1));
        // Lost nodes do not count (the pool is progressing anyway), nor unknown ones.
        assert_eq!(next_check([&healthy(40), &NodeHealth::default()]), None);
    }

    fn pod(name: &str, node: &str, ready: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod.spec = Some(PodSpec {
            node_name: Some(node.into()),
            volumes: Some(vec![
                Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: format!("data-{name}"),
                        read_only: None,
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "shared".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: "team-scratch".into(),
                        read_only: None,
                    }),
                    ..Volume::default()
                },
            ]),
            ..PodSpec::default()
        });
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn lost_for(seconds: u64, taint: Option<&'static str>) -> NodeHealth {
        NodeHealth {
            heartbeat_age: Some(seconds),
            no_schedule_taint: taint,
            ..NodeHealth::default()
        }
    }

    #[test]
    fn ready_pods_on_a_lost_node_are_marked_not_ready_once() {
        let pods = [
            pod("demo-hot-0", "worker-1", "True"),
            pod("demo-hot-1", "worker-2", "True"),
            pod("demo-hot-2", "worker-2", "False"),
        ];
        let health = BTreeMap::from([
            ("worker-1".to_owned(), lost_for(4, None)),
            ("worker-2".to_owned(), lost_for(22, None)),
        ]);
        let plan = plan_node_loss(&pods, &health);
        assert_eq!(plan.lost.len(), 1);
        let lost = &plan.lost[0];
        assert_eq!(lost.node, "worker-2");
        assert_eq!(lost.lost_seconds, 22);
        assert_eq!(lost.pods, ["demo-hot-1", "demo-hot-2"]);
        // The one already False is not patched again.
        assert_eq!(lost.mark_not_ready, ["demo-hot-1"]);
        assert!(lost.force_delete.is_empty());
        assert!(plan.force_deleting().is_none());
        // Nothing lost: nothing to do.
        let healthy = BTreeMap::from([("worker-2".to_owned(), lost_for(4, None))]);
        assert!(!plan_node_loss(&pods, &healthy).any());
    }

    #[test]
    fn one_lost_nodes_pods_are_force_deleted_per_pass_the_longest_silent_first() {
        let pods = [
            pod("demo-hot-0", "worker-1", "False"),
            pod("demo-hot-1", "worker-2", "False"),
            pod("demo-cold-0", "worker-2", "False"),
            pod("demo-hot-2", "worker-3", "True"),
        ];
        let health = BTreeMap::from([
            ("worker-1".to_owned(), lost_for(55, Some(UNREACHABLE_TAINT))),
            ("worker-2".to_owned(), lost_for(70, Some(NOT_READY_TAINT))),
            ("worker-3".to_owned(), lost_for(3, None)),
        ]);
        let plan = plan_node_loss(&pods, &health);
        let nodes: Vec<&str> = plan.lost.iter().map(|l| l.node.as_str()).collect();
        assert_eq!(nodes, ["worker-2", "worker-1"]);
        let deleting = plan.force_deleting().unwrap();
        assert_eq!(deleting.node, "worker-2");
        assert_eq!(deleting.force_delete_taint, Some(NOT_READY_TAINT));
        assert_eq!(
            deleting.force_delete,
            [
                PodToDelete {
                    name: "demo-hot-1".into(),
                    uid: Some("uid-demo-hot-1".into()),
                    claims: vec!["data-demo-hot-1".into()],
                },
                PodToDelete {
                    name: "demo-cold-0".into(),
                    uid: Some("uid-demo-cold-0".into()),
                    claims: vec!["data-demo-cold-0".into()],
                },
            ]
        );
        // worker-1 is due too, and waits for the next pass.
        assert!(plan.lost[1].force_delete_taint.is_some());
        assert!(plan.lost[1].force_delete.is_empty());
    }

    #[test]
    fn only_the_statefulsets_own_claims_are_candidates() {
        let p = pod("demo-hot-1", "worker-2", "True");
        assert_eq!(template_claims(&p), ["data-demo-hot-1"]);
        assert!(template_claims(&Pod::default()).is_empty());
    }

    fn pv(terms: Vec<Vec<(&str, &str, &[&str])>>, fields: bool) -> PersistentVolume {
        let requirement = |(key, op, values): (&str, &str, &[&str])| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        };
        PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: terms
                            .into_iter()
                            .map(|term| {
                                let reqs: Vec<_> = term.into_iter().map(requirement).collect();
                                if fields {
                                    NodeSelectorTerm {
                                        match_fields: Some(reqs),
                                        ..NodeSelectorTerm::default()
                                    }
                                } else {
                                    NodeSelectorTerm {
                                        match_expressions: Some(reqs),
                                        ..NodeSelectorTerm::default()
                                    }
                                }
                            })
                            .collect(),
                    }),
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        }
    }

    #[test]
    fn only_claims_on_volumes_pinned_to_the_lost_node_are_deleted() {
        let host = Some("worker-2.local");
        // local-path / local: hostname In [the node] (by label value or by name).
        assert!(pinned_to(
            &pv(
                vec![vec![(HOSTNAME_LABEL, "In", &["worker-2.local"])]],
                false
            ),
            "worker-2",
            host
        ));
        assert!(pinned_to(
            &pv(vec![vec![(HOSTNAME_LABEL, "In", &["worker-2"])]], false),
            "worker-2",
            None
        ));
        assert!(pinned_to(
            &pv(vec![vec![("metadata.name", "In", &["worker-2"])]], true),
            "worker-2",
            host
        ));
        // Another node's volume, or one that other nodes can use too: left alone.
        assert!(!pinned_to(
            &pv(vec![vec![(HOSTNAME_LABEL, "In", &["worker-1"])]], false),
            "worker-2",
            host
        ));
        assert!(!pinned_to(
            &pv(
                vec![vec![(HOSTNAME_LABEL, "In", &["worker-2", "worker-3"])]],
                false
            ),
            "worker-2",
            host
        ));
        assert!(!pinned_to(
            &pv(
                vec![
                    vec![(HOSTNAME_LABEL, "In", &["worker-2"])],
                    vec![(HOSTNAME_LABEL, "In", &["worker-3"])]
                ],
                false
            ),
            "worker-2",
            host
        ));
        assert!(!pinned_to(
            &pv(vec![vec![(HOSTNAME_LABEL, "NotIn", &["worker-1"])]], false),
            "worker-2",
            host
        ));
        // A zonal network disk.
        assert!(!pinned_to(
            &pv(
                vec![vec![("topology.kubernetes.io/zone", "In", &["zone-a"])]],
                false
            ),
            "worker-2",
            host
        ));
        // No affinity at all (NFS, most network volumes).
        assert!(!pinned_to(&PersistentVolume::default(), "worker-2", host));

        let claims = [
            ObservedClaim {
                name: "data-demo-hot-1".into(),
                uid: Some("c1".into()),
                volume: Some(pv(
                    vec![vec![(HOSTNAME_LABEL, "In", &["worker-2.local"])]],
                    false,
                )),
            },
            ObservedClaim {
                name: "data-demo-cold-0".into(),
                uid: Some("c2".into()),
                volume: None,
            },
        ];
        let local: Vec<&str> = node_local_claims(&claims, "worker-2", host)
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(local, ["data-demo-hot-1"]);
    }

    #[test]
    fn force_deletes_wait_while_no_other_node_is_heard_from() {
        let now = at(1_000);
        let leases = [lease("worker-1", Some(990)), lease("worker-2", Some(940))];
        assert!(others_alive(&leases, "worker-2", &now));
        let all_silent = [lease("worker-1", Some(950)), lease("worker-2", Some(940))];
        assert!(!others_alive(&all_silent, "worker-2", &now));
        // Its own fresh lease does not count.
        assert!(!others_alive(
            &[lease("worker-2", Some(999))],
            "worker-2",
            &now
        ));
    }

    #[test]
    fn the_not_ready_patch_merges_the_ready_condition_by_type() {
        let patch = not_ready_patch("worker-2", 23, &at(1_000));
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["type"], "Ready");
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], NODE_LOST_REASON);
        assert_eq!(
            condition["message"],
            "node worker-2 lost: no heartbeat for 23 s (marked by flightcache-operator)"
        );
        assert_eq!(condition["lastTransitionTime"], "1970-01-01T00:16:40Z");
        // The readiness gate closes in the same write.
        let gate = &patch["status"]["conditions"][1];
        assert_eq!(gate["type"], crate::build::names::IN_RING_CONDITION);
        assert_eq!(gate["status"], "False");
    }

    #[test]
    fn the_notes_say_what_happened() {
        let lost = LostNode {
            node: "worker-2".into(),
            hostname: None,
            lost_seconds: 52,
            pods: vec!["demo-hot-1".into()],
            mark_not_ready: vec![],
            force_delete_taint: Some(UNREACHABLE_TAINT),
            force_delete: vec![],
        };
        let note = force_deleted_note(&lost, &["demo-hot-1".into()], &["data-demo-hot-1".into()]);
        assert!(note.contains("worker-2 lost for 52 s"), "{note}");
        assert!(note.contains("node.kubernetes.io/unreachable"), "{note}");
        assert!(note.contains("node-local claims data-demo-hot-1"), "{note}");
        assert!(
            note.contains("its kubelet stops the old containers"),
            "{note}"
        );
        let note = marked_note(&lost, &["demo-hot-1".into()]);
        assert!(note.contains("demo-hot-1 marked NotReady"), "{note}");
        // What to do comes from the Warning the event is published as.
        assert_eq!(
            crate::warnings::Warning::NodeLost.reason(),
            NODE_LOST_REASON
        );
    }
}
