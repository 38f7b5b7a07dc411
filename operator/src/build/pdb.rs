//! The pool's PodDisruptionBudget: at most one node of a pool down at a time. Pure.
//!
//! Owns: the PDB. Pure like all of `build/` (checked by `scripts/check-layers`):
//! imports `validate` and `names` only.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// The PDB `c-p` with `maxUnavailable: 1`.
pub fn build_pdb(cluster: &ValidatedCluster, pool: &ValidatedPool) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: super::meta::owned_metadata(
            cluster,
            pool,
            names::pool_object(&cluster.name, &pool.name),
        ),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(names::pool_selector(&cluster.name, &pool.name)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn pdb_allows_one_node_down() {
        let cluster = validated(&[("hot", 3)]);
        let pdb = build_pdb(&cluster, &cluster.pools[0]);
        crate::build::golden::assert_golden("pdb-hot.json", &pdb);
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(names::pool_selector("demo", "hot"))
        );
    }
}
