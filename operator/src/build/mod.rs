//! Pure builders: from a [`ValidatedCluster`] to the Kubernetes objects it needs.
//!
//! No client, no clock, no environment: everything comes from the validated model, so
//! each builder is unit-tested with golden output.
//!
//! Owns: the desired objects. Must not import kube's client or Api, tokio, `observe`,
//! `apply` or `nodes` (checked by `scripts/check-layers`); imports `validate` only.

pub mod configmap;
#[cfg(test)]
pub(crate) mod golden;
pub mod meta;
pub mod names;
pub mod networkpolicy;
pub mod pdb;
pub mod placement;
pub mod service;
pub mod servicemonitor;
pub mod statefulset;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crds::node_config::Topology;

use crate::validate::ValidatedCluster;

/// Every object one pool needs, in apply order.
#[derive(Debug, Clone)]
pub struct DesiredPool {
    /// Pool name.
    pub pool: String,
    /// Node config (applied first, so a pod never starts without it).
    pub configmap: ConfigMap,
    /// Headless Service (stable node DNS).
    pub headless_service: Service,
    /// Client Service.
    pub client_service: Service,
    /// Disruption budget.
    pub pdb: PodDisruptionBudget,
    /// Who may reach the nodes (none when `spec.networkPolicy.disabled`).
    pub network_policy: Option<NetworkPolicy>,
    /// The nodes (applied last).
    pub statefulset: StatefulSet,
}

/// What the operator decided from the running pool, beyond the spec: the ring the nodes
/// route by and how many pods the StatefulSet keeps (more than `shards` while leaving
/// nodes hand their keys off).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolLayout {
    /// The published ring.
    pub topology: Topology,
    /// StatefulSet replicas.
    pub replicas: i32,
}

impl PoolLayout {
    /// A new pool: every node active, ring version 1 (a test fixture).
    #[cfg(test)]
    pub(crate) fn initial(
        cluster: &ValidatedCluster,
        pool: &crate::validate::ValidatedPool,
    ) -> Self {
        Self {
            topology: crate::ring::plan_topology(
                cluster,
                pool,
                &crate::ring::all_active(pool.shards),
                &crate::ring::no_zones(),
                None,
                0,
            ),
            replicas: pool.shards,
        }
    }
}

/// The desired objects of every pool; `layouts` in pool order.
pub fn desired_resources(cluster: &ValidatedCluster, layouts: &[PoolLayout]) -> Vec<DesiredPool> {
    cluster
        .pools
        .iter()
        .zip(layouts)
        .map(|(pool, layout)| DesiredPool {
            pool: pool.name.clone(),
            configmap: configmap::build_configmap(cluster, pool, &layout.topology),
            headless_service: service::build_headless_service(cluster, pool),
            client_service: service::build_client_service(cluster, pool),
            pdb: pdb::build_pdb(cluster, pool),
            network_policy: cluster
                .network_policy
                .as_ref()
                .map(|policy| networkpolicy::build_network_policy(cluster, pool, policy)),
            statefulset: statefulset::build_statefulset(cluster, pool, layout.replicas),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn every_child_is_owned_by_the_cluster_and_labelled_with_its_pool() {
        let cluster = validated(&[("hot", 3), ("cold", 1)]);
        let layouts: Vec<PoolLayout> = cluster
            .pools
            .iter()
            .map(|pool| PoolLayout::initial(&cluster, pool))
            .collect();
        let desired = desired_resources(&cluster, &layouts);
        assert_eq!(desired.len(), 2);
        for pool in &desired {
            let metas = [
                &pool.configmap.metadata,
                &pool.headless_service.metadata,
                &pool.client_service.metadata,
                &pool.pdb.metadata,
                &pool.statefulset.metadata,
            ];
            for meta in metas {
                assert_eq!(meta.owner_references.as_ref().unwrap()[0], cluster.owner);
                assert_eq!(meta.labels.as_ref().unwrap()[names::POOL_LABEL], pool.pool);
                assert_eq!(meta.namespace.as_deref(), Some("cache"));
            }
        }
    }
}
