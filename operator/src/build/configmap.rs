//! The pool's ConfigMap: the node config document every node of the pool starts with
//! (and re-reads when it changes): the pool's settings and its ring. Pure.
//!
//! Owns: the ConfigMap's content. Pure like all of `build/` (checked by
//! `scripts/check-layers`): imports `validate` and `names` only.

use std::collections::BTreeMap;

use crds::node_config::{NodeConfig, NodeDocument, Topology};
use crds::quantity::{format_bytes, format_duration};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names;
use crate::validate::{ValidatedCluster, ValidatedPool};

/// The node config document of `pool`.
pub fn compute_node_config(cluster: &ValidatedCluster, pool: &ValidatedPool) -> NodeConfig {
    NodeConfig {
        generation: Some(u64::try_from(cluster.generation).unwrap_or(0)),
        listen: Some(format!("0.0.0.0:{}", cluster.port)),
        metrics_listen: Some(format!("0.0.0.0:{}", cluster.metrics_port)),
        max_entries: Some(pool.max_entries),
        memory_budget: Some(format_bytes(pool.budget_bytes)),
        max_entry_size: Some(format_bytes(pool.max_entry_bytes)),
        ttl: Some(format_duration(pool.ttl)),
        ttl_mode: Some(pool.ttl_mode),
        eviction: Some(pool.eviction),
        auth_token_file: cluster
            .client_token
            .as_ref()
            .map(|_| format!("{}/auth/token", names::NODE_CONFIG_DIR)),
        admin_token_file: Some(format!(
            "{}/internal/{}",
            names::NODE_CONFIG_DIR,
            names::ADMIN_TOKEN_KEY
        )),
        peer_token_file: Some(format!(
            "{}/internal/{}",
            names::NODE_CONFIG_DIR,
            names::PEER_TOKEN_KEY
        )),
        tls_cert_file: cluster
            .tls_secret
            .as_ref()
            .map(|_| format!("{}/tls/{}", names::NODE_CONFIG_DIR, names::TLS_CERT_KEY)),
        tls_key_file: cluster
            .tls_secret
            .as_ref()
            .map(|_| format!("{}/tls/{}", names::NODE_CONFIG_DIR, names::TLS_KEY_KEY)),
        tls_ca_file: cluster
            .tls_secret
            .as_ref()
            .map(|_| format!("{}/tls/{}", names::NODE_CONFIG_DIR, names::TLS_CA_KEY)),
        tls_client_auth: (cluster.tls_secret.is_some()
            && cluster.tls_client_auth == crds::cachecluster::ClientAuth::Required)
            .then_some(crds::cachecluster::ClientAuth::Required),
        shutdown_grace: Some("20s".into()),
        location_mode: Some(pool.location_mode),
        // The node's default (10,000); the CRD has no field for it.
        max_connections: None,
    }
}

/// The fields of [`compute_node_config`] a running node takes live (`configure`).
///
/// The byte budget and entry size are left out: they follow the container's memory
/// limit, which changes by resize or restart, never ahead of it.
pub fn compute_live_config(cluster: &ValidatedCluster, pool: &ValidatedPool) -> NodeConfig {
    compute_node_config(cluster, pool).live_part(|field| !field.follows_memory())
}

/// The fields of [`compute_node_config`] a running node takes live, the byte budget and
/// entry size included (a memory change, after the container's limit allows them).
pub fn compute_budget_config(cluster: &ValidatedCluster, pool: &ValidatedPool) -> NodeConfig {
    compute_node_config(cluster, pool).live_part(|_| true)
}

/// The ConfigMap `c-p` holding `node.json`: the node config and the ring.
pub fn build_configmap(
    cluster: &ValidatedCluster,
    pool: &ValidatedPool,
    topology: &Topology,
) -> ConfigMap {
    let document = NodeDocument {
        config: compute_node_config(cluster, pool),
        topology: Some(topology.clone()),
    };
    ConfigMap {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([(
                names::CONFIG_GENERATION_ANNOTATION.to_owned(),
                cluster.generation.to_string(),
            )])),
            ..super::meta::owned_metadata(
                cluster,
                pool,
                names::pool_object(&cluster.name, &pool.name),
            )
        },
        data: Some(BTreeMap::from([(
            names::NODE_CONFIG_KEY.to_owned(),
            document.to_json(),
        )])),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn the_live_push_is_the_live_fields_of_the_node_config_and_the_budget_only_with_memory() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let live = compute_live_config(&cluster, pool);
        assert!(live.ensure_live_only().is_ok());
        assert_eq!(live.generation, Some(3));
        assert_eq!(live.max_entries, Some(pool.max_entries));
        assert_eq!(live.ttl, Some(format_duration(pool.ttl)));
        assert_eq!(live.ttl_mode, Some(pool.ttl_mode));
        assert_eq!(live.eviction, Some(pool.eviction));
        assert_eq!(live.location_mode, Some(pool.location_mode));
        assert_eq!((live.memory_budget, live.max_entry_size), (None, None));
        let budget = compute_budget_config(&cluster, pool);
        assert!(budget.ensure_live_only().is_ok());
        assert_eq!(budget.memory_budget, Some(format_bytes(pool.budget_bytes)));
        assert_eq!(
            budget.max_entry_size,
            Some(format_bytes(pool.max_entry_bytes))
        );
        assert_eq!(budget.ttl, live.ttl);
    }

    #[test]
    fn node_config_carries_the_pool_settings_and_parses_back() {
        let cluster = validated(&[("hot", 3)]);
        let pool = &cluster.pools[0];
        let layout = crate::build::PoolLayout::initial(&cluster, pool);
        let cm = build_configmap(&cluster, pool, &layout.topology);
        crate::build::golden::assert_golden("configmap-hot.json", &cm);
        assert_eq!(cm.metadata.name.as_deref(), Some("demo-hot"));
        let text = &cm.data.as_ref().unwrap()[names::NODE_CONFIG_KEY];
        let document = NodeDocument::from_json(text).unwrap();
        assert_eq!(document.topology.as_ref(), Some(&layout.topology));
        let doc = document.config;
        assert_eq!(doc.generation, Some(3));
        assert_eq!(doc.listen.as_deref(), Some("0.0.0.0:50051"));
        assert_eq!(
            doc.memory_budget_bytes().unwrap(),
            Some(cluster.pools[0].budget_bytes)
        );
        assert_eq!(doc.ttl_duration().unwrap(), Some(cluster.pools[0].ttl));
        // Auth is on by default: the generated client token, and always the admin
        // and peer tokens.
        assert_eq!(
            doc.auth_token_file.as_deref(),
            Some("/etc/flightcache/auth/token")
        );
        assert_eq!(
            doc.admin_token_file.as_deref(),
            Some("/etc/flightcache/internal/admin-token")
        );
        assert_eq!(
            doc.peer_token_file.as_deref(),
            Some("/etc/flightcache/internal/peer-token")
        );
    }

    #[test]
    fn disabled_client_auth_keeps_the_admin_and_peer_tokens() {
        let mut cc = crate::validate::fixtures::cluster(&[("hot", 1)]);
        cc.spec.auth = Some(crds::cachecluster::AuthSpec {
            disabled: true,
            ..Default::default()
        });
        let cluster =
            crate::validate::validate(&cc, &crate::validate::fixtures::defaults()).unwrap();
        let doc = compute_node_config(&cluster, &cluster.pools[0]);
        assert_eq!(doc.auth_token_file, None);
        assert!(doc.admin_token_file.is_some() && doc.peer_token_file.is_some());
    }
}
