//! The pool's NetworkPolicy: ingress to the pool's nodes only from the pool's own nodes
//! (forwarding, replicas, handover), the operator (node calls on the Flight port), the
//! clients `spec.networkPolicy.clients` names (default: the cluster's namespace) on the
//! Flight port, and the metrics scrapers on the metrics port. Egress is left alone
//! (nodes resolve each other's names and call each other). Pure.
//!
//! Owns: the NetworkPolicy's rules. Pure like all of `build/` (checked by
//! `scripts/check-layers`): imports `validate` and `names` only.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::owned_metadata;
use super::names;
use crate::validate::{ValidatedCluster, ValidatedNetworkPolicy, ValidatedPool};

/// The label every namespace carries with its own name (set by the API server).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The label of the operator's pods (the chart's selector).
const OPERATOR_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "flightcache-operator");

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

/// The NetworkPolicy of `pool` under `policy`.
pub fn build_network_policy(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    policy: &ValidatedNetworkPolicy,
) -> NetworkPolicy {
    // The pool's own nodes (same namespace: a podSelector alone).
    let peers = NetworkPolicyPeer {
        pod_selector: Some(selector(names::pool_selector(&cluster.name, &pool.name))),
        ..NetworkPolicyPeer::default()
    };
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(selector(BTreeMap::from([(
            NAMESPACE_NAME_LABEL.to_owned(),
            policy.operator_namespace.clone(),
        )]))),
        pod_selector: Some(selector(BTreeMap::from([(
            OPERATOR_POD_LABEL.0.to_owned(),
            OPERATOR_POD_LABEL.1.to_owned(),
        )]))),
        ..NetworkPolicyPeer::default()
    };
    let mut flight_from = vec![peers, operator];
    flight_from.extend(policy.clients.iter().cloned());
    let flight = NetworkPolicyIngressRule {
        from: Some(flight_from),
        ports: Some(vec![tcp(cluster.port)]),
    };
    let metrics = NetworkPolicyIngressRule {
        // None: from anywhere, on this port only.
        from: policy.metrics_scrapers.clone(),
        ports: Some(vec![tcp(cluster.metrics_port)]),
    };
    NetworkPolicy {
        metadata: owned_metadata(cluster, pool, names::pool_object(&cluster.name, &pool.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(names::pool_selector(&cluster.name, &pool.name))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![flight, metrics]),
            egress: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::{cluster, defaults, validated};

    #[test]
    fn network_policy_matches_the_golden_file() {
        let cluster = validated(&[("hot", 3)]);
        let policy = cluster.network_policy.as_ref().unwrap();
        let np = build_network_policy(&cluster, &cluster.pools[0], policy);
        crate::build::golden::assert_golden("networkpolicy-hot.json", &np);
    }

    #[test]
    fn by_default_the_clusters_namespace_reaches_the_flight_port_and_anyone_the_metrics() {
        let cluster = validated(&[("hot", 3)]);
        let policy = cluster.network_policy.as_ref().unwrap();
        let spec = build_network_policy(&cluster, &cluster.pools[0], policy)
            .spec
            .unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
        let rules = spec.ingress.unwrap();
        let flight_from = rules[0].from.clone().unwrap();
        // Peers, the operator, then the default client rule: every pod of the namespace.
        assert_eq!(flight_from.len(), 3);
        assert_eq!(
            flight_from[2],
            NetworkPolicyPeer {
                pod_selector: Some(LabelSelector::default()),
                ..NetworkPolicyPeer::default()
            }
        );
        assert_eq!(rules[0].ports, Some(vec![tcp(50051)]));
        assert_eq!(rules[1].from, None);
        assert_eq!(rules[1].ports, Some(vec![tcp(9090)]));
    }

    #[test]
    fn named_clients_replace_the_namespace_default_and_disabled_means_none() {
        let mut cc = cluster(&[("hot", 1)]);
        let only_bi = NetworkPolicyPeer {
            namespace_selector: Some(selector(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                "bi".to_owned(),
            )]))),
            ..NetworkPolicyPeer::default()
        };
        cc.spec.network_policy = Some(crds::cachecluster::NetworkPolicySpec {
            clients: Some(vec![only_bi.clone()]),
            ..Default::default()
        });
        let valid = crate::validate::validate(&cc, &defaults()).unwrap();
        let policy = valid.network_policy.as_ref().unwrap();
        let spec = build_network_policy(&valid, &valid.pools[0], policy)
            .spec
            .unwrap();
        let flight_from = spec.ingress.unwrap()[0].from.clone().unwrap();
        assert_eq!(flight_from.len(), 3);
        assert_eq!(flight_from[2], only_bi);
        cc.spec.network_policy = Some(crds::cachecluster::NetworkPolicySpec {
            disabled: true,
            ..Default::default()
        });
        let valid = crate::validate::validate(&cc, &defaults()).unwrap();
        assert!(valid.network_policy.is_none());
    }
}
