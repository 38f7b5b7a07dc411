//! Reading node pods: readiness, the template hash each was created from, memory limits
//! and resize state. Pure.
//!
//! Which node restarts, drains or joins next is decided in [`crate::plan`].
//!
//! Owns: the pod readers. Must not import kube's client, tokio or any I/O (checked by
//! `scripts/check-layers`); imports `build::names` only.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::build::names;

/// A node pod's readiness gate: the condition the operator writes and the kubelet reads
/// into the pod's Ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No gate in its spec (a pod of a template from before the gate): Ready is the
    /// kubelet's alone.
    Ungated,
    /// `True`: the node may take client calls.
    Open,
    /// Not `True` (absent on a new pod, `False` while held out): the pod is not Ready
    /// until the operator opens it. `up`: its containers are ready, so it answers.
    Closed {
        /// The pod's `ContainersReady` is `True` (and its node is not lost).
        up: bool,
    },
}

/// Whether a pod is Ready (and not terminating).
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && ready_condition_true(pod)
}

/// Whether the pod's containers pass their readiness probes (`ContainersReady`) and it
/// is not terminating: its node answers, whatever its readiness gate says.
pub fn containers_up(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && condition_true(pod, "ContainersReady")
}

/// Whether the pod's `Ready` condition is `True` (a terminating pod's included: it may
/// still be a serving endpoint).
pub fn ready_condition_true(pod: &Pod) -> bool {
    condition_true(pod, "Ready")
}

/// The pod's condition of type `type_` is `True`.
fn condition_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == "True")
        })
}

/// The pod's readiness gate ([`names::IN_RING_CONDITION`]) as the planner sees it.
pub fn gate(pod: &Pod) -> Gate {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.readiness_gates.as_ref())
        .is_some_and(|gates| {
            gates
                .iter()
                .any(|g| g.condition_type == names::IN_RING_CONDITION)
        });
    if !gated {
        Gate::Ungated
    } else if condition_true(pod, names::IN_RING_CONDITION) {
        Gate::Open
    } else {
        Gate::Closed {
            up: containers_up(pod),
        }
    }
}

/// The status patch that sets a pod's readiness gate: `open` (`True`, the node runs the
/// current ring) or held out (`False`), as of `now` — a strategic merge of
/// `status.conditions`, merged by type, so the kubelet's conditions stay.
pub fn gate_patch(open: bool, now: &Time) -> serde_json::Value {
    let (status, reason, message) = if open {
        (
            "True",
            "RingCurrent",
            "the node runs the pool's current ring (flightcache-operator)",
        )
    } else {
        (
            "False",
            "HeldOut",
            "out of the key space after it could not be reached; back once it runs the current ring, which drops what it held (flightcache-operator)",
        )
    };
    serde_json::json!({"status": {"conditions": [{
        "type": names::IN_RING_CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }]}})
}

/// Seconds since the pod became Ready, as of `now` (0 when it is not Ready).
pub fn ready_seconds(pod: &Pod, now: &Time) -> u64 {
    if !is_ready(pod) {
        return 0;
    }
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or(0, |since| {
            u64::try_from(now.0.as_second() - since.0.as_second()).unwrap_or(0)
        })
}

/// Seconds since the pod's Ready condition turned False, as of `now` (0 while it is True,
/// a terminating pod's included, or when there is none yet).
pub fn unready_seconds(pod: &Pod, now: &Time) -> u64 {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or(0, |since| {
            u64::try_from(now.0.as_second() - since.0.as_second()).unwrap_or(0)
        })
}

/// The pod template hash a pod was created from (`flightcache.dev/config-hash`).
pub fn template_hash_of(pod: &Pod) -> Option<&str> {
    pod.annotations()
        .get(crate::build::names::CONFIG_HASH_ANNOTATION)
        .map(String::as_str)
}

/// The node container's memory limit in the pod spec, and the one the kubelet reports
/// applied, in bytes.
pub fn memory_limits(pod: &Pod) -> (Option<u64>, Option<u64>) {
    let memory = |limits: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        limits
            .and_then(|l| l.get("memory"))
            .and_then(|q| crds::quantity::parse_bytes(&q.0).ok())
    };
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == NODE_CONTAINER))
        .and_then(|c| memory(c.resources.as_ref().and_then(|r| r.limits.as_ref())));
    let applied = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|c| c.name == NODE_CONTAINER))
        .and_then(|c| memory(c.resources.as_ref().and_then(|r| r.limits.as_ref())));
    (spec, applied)
}

/// Whether the kubelet reported the pod's resize infeasible (it cannot be done in place
/// on this node).
pub fn resize_infeasible(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodResizePending"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("Infeasible")
            })
        })
}

/// Name of the cache node container in a node pod.
pub const NODE_CONTAINER: &str = "node";

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    use super::*;

    fn pod(template_hash: &str, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("c-p-0".into());
        pod.annotations_mut().insert(
            crate::build::names::CONFIG_HASH_ANNOTATION.into(),
            template_hash.into(),
        );
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn readiness_comes_from_the_ready_condition_and_ends_at_deletion() {
        assert!(is_ready(&pod("a", true)));
        assert!(!is_ready(&pod("a", false)));
        let mut terminating = pod("a", true);
        terminating.metadata.deletion_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!is_ready(&terminating));
        assert!(!is_ready(&Pod::default()));
    }

    #[test]
    fn ready_seconds_count_from_the_ready_transition() {
        let at = |secs| Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap());
        let mut ready = pod("a", true);
        ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
            Some(at(100));
        assert_eq!(ready_seconds(&ready, &at(107)), 7);
        assert_eq!(ready_seconds(&pod("a", false), &at(107)), 0);
    }

    #[test]
    fn unready_seconds_count_from_the_transition_to_not_ready() {
        let at = |secs| Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap());
        let since = |ready, secs| {
            let mut pod = pod("a", ready);
            pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
                Some(at(secs));
            pod
        };
        assert_eq!(unready_seconds(&since(false, 100), &at(120)), 20);
        assert_eq!(unready_seconds(&since(true, 100), &at(120)), 0);
        // Terminating but still Ready: not unready (a planned drain is not an outage).
        let mut terminating = since(true, 100);
        terminating.metadata.deletion_timestamp = Some(at(110));
        assert_eq!(unready_seconds(&terminating, &at(120)), 0);
        assert_eq!(unready_seconds(&Pod::default(), &at(120)), 0);
    }

    #[test]
    fn the_template_hash_is_the_config_hash_annotation() {
        assert_eq!(template_hash_of(&pod("abc123", true)), Some("abc123"));
        assert_eq!(template_hash_of(&Pod::default()), None);
    }
}
