//! The metadata every child of a pool carries: its name and namespace, the pool's labels
//! and the CacheCluster as controlling owner. The builders' shared leaf: it imports
//! `names` and the validated model, and no builder.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// Metadata of a pool's child `name`: namespace, pool labels, the controller owner
/// reference.
pub fn owned_metadata(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    name: String,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(cluster.namespace.clone()),
        labels: Some(names::pool_labels(&cluster.name, &pool.name)),
        owner_references: Some(vec![cluster.owner.clone()]),
        ..ObjectMeta::default()
    }
}
