//! Reading node pods: readiness and the StatefulSet revision each was created from. Pure.
//!
//! Which node restarts, drains or joins next is decided in [`crate::plan`].

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Label the StatefulSet controller sets to the revision a pod was created from.
const REVISION_LABEL: &str = "controller-revision-hash";

/// Whether a pod is Ready (and not terminating).
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

/// The StatefulSet revision a pod was created from.
pub fn revision_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(REVISION_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(revision: &str, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("c-p-0".into());
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
    fn the_revision_is_the_statefulset_label() {
        assert_eq!(revision_of(&pod("abc123", true)), Some("abc123"));
        assert_eq!(revision_of(&Pod::default()), None);
    }
}
