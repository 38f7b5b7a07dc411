//! The cluster's prometheus-operator `ServiceMonitor` (`spec.monitoring.serviceMonitor`):
//! one per CacheCluster, scraping the `metrics` port of every pool's headless Service,
//! so each node is scraped once (the client Services front the same pods). Pure.
//!
//! Built as a dynamic object: the `monitoring.coreos.com` types are not part of
//! Kubernetes, and the operator must run where they are not installed.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta};
use serde_json::json;

use super::names;
use crate::validate::ValidatedCluster;

/// The `monitoring.coreos.com/v1` `ServiceMonitor` resource.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// The ServiceMonitor `<cluster>-nodes` for `cluster`.
pub fn build_service_monitor(cluster: &ValidatedCluster) -> DynamicObject {
    let mut selector = names::cluster_selector(&cluster.name);
    selector.insert(names::SERVICE_ROLE_LABEL.to_owned(), "nodes".to_owned());
    let mut labels = names::cluster_selector(&cluster.name);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        names::MANAGED_BY.to_owned(),
    );
    let mut monitor = DynamicObject::new(
        &names::service_monitor(&cluster.name),
        &service_monitor_resource(),
    )
    .within(&cluster.namespace);
    monitor.metadata = ObjectMeta {
        labels: Some(labels),
        owner_references: Some(vec![cluster.owner.clone()]),
        ..monitor.metadata
    };
    monitor.data = json!({
        "spec": {
            "selector": { "matchLabels": selector },
            "namespaceSelector": { "matchNames": [cluster.namespace] },
            "endpoints": [{ "port": "metrics", "path": "/metrics", "interval": "30s" }],
            // Each node's series carry its pool and pod name.
            "targetLabels": [names::POOL_LABEL],
        }
    });
    monitor
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::fixtures::validated;

    #[test]
    fn it_scrapes_the_metrics_port_of_the_headless_services_only() {
        let cluster = validated(&[("hot", 3), ("cold", 1)]);
        let monitor = build_service_monitor(&cluster);
        let value = serde_json::to_value(&monitor).unwrap();
        assert_eq!(value["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(value["kind"], "ServiceMonitor");
        assert_eq!(value["metadata"]["name"], "demo-nodes");
        assert_eq!(value["metadata"]["namespace"], "cache");
        assert_eq!(
            value["metadata"]["ownerReferences"][0]["name"],
            cluster.owner.name
        );
        let selector = &value["spec"]["selector"]["matchLabels"];
        assert_eq!(selector[names::SERVICE_ROLE_LABEL], "nodes");
        assert_eq!(selector[names::INSTANCE_LABEL], "demo");
        assert_eq!(value["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(value["spec"]["namespaceSelector"]["matchNames"][0], "cache");
        // The headless Services carry the label it selects; the client Services do not.
        for pool in &cluster.pools {
            let headless = super::super::service::build_headless_service(&cluster, pool);
            let client = super::super::service::build_client_service(&cluster, pool);
            let role = |s: &k8s_openapi::api::core::v1::Service| {
                s.metadata.labels.as_ref().unwrap()[names::SERVICE_ROLE_LABEL].clone()
            };
            assert_eq!(role(&headless), "nodes");
            assert_eq!(role(&client), "client");
        }
    }
}
