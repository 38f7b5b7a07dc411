//! Which node restarts next when the pod template changed (StatefulSets run `OnDelete`,
//! so the operator decides). Pure: a function of the observed StatefulSet and pods.
//!
//! One node at a time, and only when every node of the pool is Ready, so a pool never
//! has more than one node down. Highest ordinal first, as a RollingUpdate would.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Label the StatefulSet controller sets to the revision a pod was created from.
const REVISION_LABEL: &str = "controller-revision-hash";

/// Whether a pod is Ready.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// Pods of the pool that run the StatefulSet's current revision.
pub fn count_updated(sts: &StatefulSet, pods: &[&Pod]) -> usize {
    let Some(update_revision) = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref())
    else {
        return 0;
    };
    pods.iter()
        .filter(|pod| pod.labels().get(REVISION_LABEL).map(String::as_str) == Some(update_revision))
        .count()
}

/// The pod to restart now, if any: none while a node is missing or not Ready, or when
/// every pod runs the current revision.
pub fn plan_restart(sts: &StatefulSet, pods: &[&Pod]) -> Option<String> {
    let status = sts.status.as_ref()?;
    let update_revision = status.update_revision.as_deref()?;
    let desired = usize::try_from(sts.spec.as_ref()?.replicas.unwrap_or(1)).ok()?;
    if pods.len() < desired || !pods.iter().all(|pod| is_ready(pod)) {
        return None;
    }
    pods.iter()
        .filter(|pod| pod.labels().get(REVISION_LABEL).map(String::as_str) != Some(update_revision))
        .max_by_key(|pod| ordinal(&pod.name_any()))
        .map(|pod| pod.name_any())
}

fn ordinal(name: &str) -> u32 {
    name.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    use super::*;

    fn sts(replicas: i32) -> StatefulSet {
        StatefulSet {
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                ..StatefulSetSpec::default()
            }),
            status: Some(StatefulSetStatus {
                update_revision: Some("new".into()),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        }
    }

    fn pod(name: &str, revision: &str, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.labels_mut()
            .insert(REVISION_LABEL.into(), revision.into());
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
    fn restarts_the_highest_outdated_ordinal_when_all_are_ready() {
        let pods = [
            pod("c-p-0", "old", true),
            pod("c-p-1", "old", true),
            pod("c-p-2", "new", true),
        ];
        let refs: Vec<_> = pods.iter().collect();
        assert_eq!(plan_restart(&sts(3), &refs).as_deref(), Some("c-p-1"));
        assert_eq!(count_updated(&sts(3), &refs), 1);
    }

    #[test]
    fn waits_while_a_node_is_down_or_missing() {
        let pods = [pod("c-p-0", "old", true), pod("c-p-1", "new", false)];
        let refs: Vec<_> = pods.iter().collect();
        assert_eq!(plan_restart(&sts(2), &refs), None);
        assert_eq!(plan_restart(&sts(3), &refs[..1]), None);
    }

    #[test]
    fn nothing_to_do_when_every_node_is_current() {
        let pods = [pod("c-p-0", "new", true), pod("c-p-1", "new", true)];
        let refs: Vec<_> = pods.iter().collect();
        assert_eq!(plan_restart(&sts(2), &refs), None);
    }
}
